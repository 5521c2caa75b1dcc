package main

import (
	"context"
	"fmt"
	"io"

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// The reads of dead letters that the command's lists and the console share: their cost
// does not grow with what the entries hold (docs/security.md, "Bounded cost per request").

// previewBytes is how much of a body, of raw evidence and of each text "show" and the
// console's entry page print; the rest is a download of its own (show --body, --raw).
const previewBytes = 64 << 10

// summaries lists the entries that match f, or the one entry id when it is set (if it
// matches f too), without their bodies: a list costs the same whatever they hold.
func (s *store) summaries(ctx context.Context, f deadletter.Filter, id int64) ([]sqlstore.DeadLetterSummary, error) {
	if id != 0 {
		f.AfterID, f.Limit = id-1, 1
	}
	es, err := sqlstore.DeadLetterSummaries(ctx, s.dialect, s.q, s.names, f)
	if id != 0 && len(es) == 1 && es[0].ID != id {
		es = nil
	}
	return es, err
}

// matching returns the IDs of every entry that matches f (or entry id alone, when set), a
// page of summaries at a time.
func (s *store) matching(ctx context.Context, f deadletter.Filter, id int64) ([]int64, error) {
	var ids []int64
	f.Limit = 1000
	for {
		page, err := s.summaries(ctx, f, id)
		for _, e := range page {
			ids = append(ids, e.ID)
		}
		if err != nil || id != 0 || len(page) < f.Limit {
			return ids, err
		}
		f.AfterID = page[len(page)-1].ID
	}
}

// copyBytes writes entry id's body ("body") or raw evidence ("raw") to w a chunk at a
// time, calling before with its size first; found is false when there is no such entry or
// it has no raw evidence.
func (s *store) copyBytes(ctx context.Context, w io.Writer, id int64, column string, before func(total int64)) (found bool, err error) {
	const chunk = 256 << 10
	var offset int64
	for {
		b, total, ok, err := sqlstore.DeadLetterBytes(ctx, s.dialect, s.q, s.names, id, column, offset, chunk)
		switch {
		case err != nil:
			return offset > 0, err
		case !ok && offset == 0:
			return false, nil
		case !ok:
			return true, fmt.Errorf("dead letter %d went away after %d bytes", id, offset)
		}
		if offset == 0 && before != nil {
			before(total)
		}
		if _, err := w.Write(b); err != nil {
			return true, err
		}
		offset += int64(len(b))
		if offset >= total || len(b) == 0 {
			return true, nil
		}
	}
}
