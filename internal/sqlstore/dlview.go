package sqlstore

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox/deadletter"
)

// This file holds the operator's reads of the dead-letter table whose cost does not grow
// with what the entries hold: a list that never selects a body, headers or raw evidence; a
// preview of one entry with everything cut to a size; a body read a chunk at a time. The
// console and the command's lists use them, so a GET costs the same whether the dead
// letters hold 100 bytes or 100 MiB. deadletter.Table's List and Get stay whole, for
// programs.

// listTextMax is how many characters of each text column a [DeadLetterSummary] keeps:
// longer values are cut, ending in "…". The reason keeps listReasonMax.
const (
	listTextMax   = 200
	listReasonMax = 1000
)

// DeadLetterSummary is a dead letter as a list shows it: Message.Body, Message.Headers and
// Raw are left out (nil), its text columns are cut (to 200 characters, the reason to 1,000,
// ending in "…"), and BodyBytes and RawBytes say how large what was left out is.
type DeadLetterSummary struct {
	deadletter.Entry
	BodyBytes int64
	// RawBytes is the size of the raw evidence; 0 when the entry has none.
	RawBytes int64
}

// DeadLetterSummaries lists n's dead letters that match f, in ID order (f.Limit: default
// 100, at most 10,000), as [DeadLetterSummary] values.
func DeadLetterSummaries(ctx context.Context, d Dialect, q Querier, n *Names, f deadletter.Filter) ([]DeadLetterSummary, error) {
	v := d.sql()
	where, args, limit := listWhere(f, v.bindTime, v.contains)
	args = append(args, limit)
	cut := func(col string, max int) string { return "substr(" + col + ", 1, " + strconv.Itoa(max+1) + ")" }
	query := "SELECT id, " + v.eventID + ", " + cut("event_type", listTextMax) + ", " + cut("event_key", listTextMax) + ", " +
		cut("content_type", listTextMax) + ", " + v.size("body") + ", created_at, stage, kind, " + cut("consumer", listTextMax) + ", " +
		cut("reason", listReasonMax) + ", attempts, first_failed_at, last_failed_at, status, COALESCE(status_changed_at, " + v.epoch + "), " +
		cut("broker_message_id", listTextMax) + ", COALESCE(" + v.size("raw") + ", 0) FROM " + n.DeadLetters +
		" WHERE " + strings.Join(where, " AND ") + " ORDER BY id LIMIT ?"
	rows, err := q.Query(ctx, v.rebind(query), args...)
	if err != nil {
		return nil, fmt.Errorf("listing the dead letters of %s: %w", n.Outbox, err)
	}
	defer rows.Close()
	var out []DeadLetterSummary
	for rows.Next() {
		var (
			s                             DeadLetterSummary
			id, stage, kind, state        string
			created, first, last, changed lenientTime
		)
		m := &s.Message
		if err := rows.Scan(&s.ID, &id, &m.Type, &m.Key, &m.ContentType, &s.BodyBytes, &created, &stage, &kind, &s.Consumer,
			&s.Reason, &s.Attempts, &first, &last, &state, &changed, &s.BrokerMessageID, &s.RawBytes); err != nil {
			return nil, fmt.Errorf("listing the dead letters of %s: %w", n.Outbox, err)
		}
		m.ID, _ = uuid.Parse(id) // one that is not a UUID shows as none; the entry's page has it
		m.Type, m.Key, m.ContentType = cutText(m.Type, listTextMax), cutText(m.Key, listTextMax), cutText(m.ContentType, listTextMax)
		s.Consumer, s.Reason = cutText(s.Consumer, listTextMax), cutText(s.Reason, listReasonMax)
		s.BrokerMessageID = cutText(s.BrokerMessageID, listTextMax)
		s.Stage, s.Kind, s.Status = deadletter.Stage(stage), deadletter.Kind(kind), deadletter.Status(state)
		s.FirstFailedAt, s.LastFailedAt, m.CreatedAt = first.t, last.t, created.t
		if changed.t.Unix() > 0 {
			s.StatusChangedAt = changed.t
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing the dead letters of %s: %w", n.Outbox, err)
	}
	return out, nil
}

// DeadLetterPreview is one dead letter with everything it holds cut to a size: the body and
// the raw evidence to max bytes, each text to max characters (ending in "…").
type DeadLetterPreview struct {
	deadletter.Entry
	// BodyBytes and RawBytes are the whole sizes of the body and of the raw column (0: no
	// raw evidence); Message.Body is cut when BodyBytes is larger than it.
	BodyBytes, RawBytes int64
	// RawCut says the raw column was longer than max: Raw holds the fields that were read
	// in full and the start of its body.
	RawCut bool
}

// PreviewDeadLetter reads dead letter id of n, cut to max bytes and characters (see
// [DeadLetterPreview]). It fails with deadletter.ErrNotFound when there is none.
func PreviewDeadLetter(ctx context.Context, d Dialect, q Querier, n *Names, id int64, max int) (DeadLetterPreview, error) {
	v := d.sql()
	var p DeadLetterPreview
	found, err := scanRow(ctx, q, []any{&p.BodyBytes, &p.RawBytes}, v.rebind("SELECT "+v.size("body")+", COALESCE("+v.size("raw")+", 0) FROM "+
		n.DeadLetters+" WHERE id = ?"), id)
	if err != nil {
		return p, fmt.Errorf("reading dead letter %d of %s: %w", id, n.Outbox, err)
	}
	if !found {
		return p, fmt.Errorf("%w: %d", deadletter.ErrNotFound, id)
	}
	m := strconv.Itoa(max)
	text := func(col string) string { return "substr(" + col + ", 1, " + strconv.Itoa(max+1) + ")" }
	bin := func(col string) string { return "substr(" + col + ", 1, " + m + ")" }
	// The columns of scanDeadLetters, each cut.
	query := "SELECT id, " + v.eventID + ", " + text("event_type") + ", " + text("event_key") + ", " + text(v.headers) + ", " +
		text("content_type") + ", " + bin("body") + ", created_at, stage, kind, " + text("consumer") + ", " + text("reason") +
		", attempts, first_failed_at, last_failed_at, status, COALESCE(status_changed_at, " + v.epoch + "), " + text("broker_message_id") + ", " + bin("raw") +
		", COALESCE(held_seq, 0) FROM " + n.DeadLetters + " WHERE id = ?"
	rows, err := q.Query(ctx, v.rebind(query), id)
	if err != nil {
		return p, fmt.Errorf("reading dead letter %d of %s: %w", id, n.Outbox, err)
	}
	es, err := scanDeadLetters(rows)
	if err != nil {
		return p, fmt.Errorf("reading dead letter %d of %s: %w", id, n.Outbox, err)
	}
	if len(es) == 0 {
		return p, fmt.Errorf("%w: %d", deadletter.ErrNotFound, id)
	}
	p.Entry = es[0]
	e := &p.Entry
	e.Message.Type, e.Message.Key, e.Message.ContentType = cutText(e.Message.Type, max), cutText(e.Message.Key, max), cutText(e.Message.ContentType, max)
	e.Consumer, e.Reason, e.BrokerMessageID = cutText(e.Consumer, max), cutText(e.Reason, max), cutText(e.BrokerMessageID, max)
	if e.Raw != nil && e.Raw.HeadersText != "" {
		e.Raw.HeadersText = cutText(e.Raw.HeadersText, max)
	}
	if p.RawBytes > int64(max) && e.Raw != nil {
		p.RawCut = true
		e.Raw = previewRaw(e.Raw)
	}
	return p, nil
}

// previewRaw reads the raw evidence again when its column was cut inside the fields (the
// whole prefix came back as Body, unparsed): the fields read in full, without the cut line.
func previewRaw(r *deadletter.Raw) *deadletter.Raw {
	if r.Body == nil || !bytes.HasPrefix(r.Body, []byte("txoutbox-raw/1\n")) {
		return r // parsed: the cut fell in the body
	}
	i := bytes.LastIndexByte(r.Body, '\n')
	var again deadletter.Raw
	if again.UnmarshalText(r.Body[:i+1]) != nil {
		return r
	}
	// What scanDeadLetters found unreadable in the other columns stays.
	again.ID, again.HeadersText, again.CreatedAt = r.ID, r.HeadersText, r.CreatedAt
	return &again
}

// DeadLetterBytes reads up to size bytes of dead letter id's body (column "body") or raw
// evidence ("raw"), from offset, and the column's whole size. found is false when there is
// no such entry, or it has no raw evidence.
func DeadLetterBytes(ctx context.Context, d Dialect, q Querier, n *Names, id int64, column string, offset int64, size int) (chunk []byte, total int64, found bool, err error) {
	if column != "body" && column != "raw" {
		return nil, 0, false, fmt.Errorf("sqlstore: no binary column %q", column)
	}
	v := d.sql()
	total = -1
	found, err = scanRow(ctx, q, []any{&chunk, &total}, v.rebind("SELECT substr("+column+", ?, ?), COALESCE("+v.size(column)+", -1) FROM "+
		n.DeadLetters+" WHERE id = ?"), offset+1, size, id)
	if err != nil {
		return nil, 0, false, fmt.Errorf("reading the %s of dead letter %d of %s: %w", column, id, n.Outbox, err)
	}
	if !found || total < 0 {
		return nil, 0, false, nil
	}
	return chunk, total, true, nil
}

// cutText shortens s to max characters, the last one "…", when it is longer.
func cutText(s string, max int) string {
	if len(s) <= max || utf8.RuneCountInString(s) <= max {
		return s
	}
	n := 0
	for i := range s {
		if n == max-1 {
			return s[:i] + "…"
		}
		n++
	}
	return s
}
