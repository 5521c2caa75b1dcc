package deadletter

import (
	"context"
	"errors"
	"fmt"
)

// Matching returns the IDs of every entry that matches f, in ID order, reading the table a
// page at a time: f.Limit is the page size (default 1,000) and f.AfterID where to start.
// Acting on the IDs afterwards (see [ReplayEach]) touches exactly the entries counted, not
// those that failed since.
func Matching(ctx context.Context, t Table, f Filter) ([]int64, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	var ids []int64
	for {
		page, err := t.List(ctx, f)
		if err != nil {
			return ids, err
		}
		for _, e := range page {
			ids = append(ids, e.ID)
		}
		if len(page) < f.Limit {
			return ids, nil
		}
		f.AfterID = page[len(page)-1].ID
	}
}

// BulkResult is what [ReplayEach] or [DiscardEach] did.
type BulkResult struct {
	// Done counts the entries replayed or discarded.
	Done int
	// Skipped counts the entries that were no longer pending, or no longer there, when
	// their turn came: someone else acted on them first.
	Skipped int
	// Refused holds the entries that cannot be replayed ([ErrNotReplayable]), with why.
	Refused map[int64]error
}

// ReplayEach replays the entries ids, one transaction each (see [Table.Replay]), in order.
// Entries no longer pending are skipped, entries that cannot be replayed are refused, and
// both are counted in the result; any other error (the database is down, ctx ended) stops
// the run and is returned with what was done until then. progress, when not nil, is called
// after each entry with the number of entries handled so far.
func ReplayEach(ctx context.Context, t Table, ids []int64, progress func(handled int)) (BulkResult, error) {
	return each(ctx, ids, progress, t.Replay)
}

// DiscardEach discards the entries ids, one transaction each (see [Table.Discard]), as
// [ReplayEach] replays them.
func DiscardEach(ctx context.Context, t Table, ids []int64, progress func(handled int)) (BulkResult, error) {
	return each(ctx, ids, progress, t.Discard)
}

func each(ctx context.Context, ids []int64, progress func(int), act func(context.Context, int64) error) (BulkResult, error) {
	var r BulkResult
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return r, fmt.Errorf("deadletter: stopped after %d of %d entries: %w", i, len(ids), err)
		}
		switch err := act(ctx, id); {
		case err == nil:
			r.Done++
		case errors.Is(err, ErrNotPending), errors.Is(err, ErrNotFound):
			r.Skipped++
		case errors.Is(err, ErrNotReplayable):
			if r.Refused == nil {
				r.Refused = map[int64]error{}
			}
			r.Refused[id] = err
		default:
			return r, fmt.Errorf("deadletter: entry %d (after %d of %d): %w", id, i, len(ids), err)
		}
		if progress != nil {
			progress(i + 1)
		}
	}
	return r, nil
}
