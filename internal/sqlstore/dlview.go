package sqlstore

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
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

// ListTextMax is how many characters of each text column a [DeadLetterSummary] keeps:
// longer values are cut, ending in "…". The reason keeps [ListReasonMax].
const (
	ListTextMax   = 200
	ListReasonMax = 1000
)

// dlViewSQL is what these reads need of a dialect.
type dlViewSQL struct {
	eventID, headers, changed string
	// size is the size in bytes of the binary column col (NULL for NULL).
	size     func(col string) string
	bindTime func(time.Time) any
	contains string
}

func viewSQL(d Dialect) dlViewSQL {
	switch d.Name() {
	case "postgres":
		return dlViewSQL{
			eventID: "coalesce(event_id::text, '')", headers: "coalesce(headers::text, '')",
			changed:  "coalesce(status_changed_at, 'epoch'::timestamptz)",
			size:     func(col string) string { return "octet_length(" + col + ")" },
			bindTime: func(t time.Time) any { return t }, contains: "strpos(reason, ?) > 0",
		}
	case "mysql":
		return dlViewSQL{
			eventID: "COALESCE(event_id, '')", headers: mysqlConsumer.headers,
			changed:  "COALESCE(status_changed_at, '1970-01-01 00:00:00')",
			size:     func(col string) string { return "LENGTH(" + col + ")" },
			bindTime: mysqlConsumer.failTime, contains: mysqlConsumer.contains,
		}
	}
	return dlViewSQL{
		eventID: "COALESCE(event_id, '')", headers: sqliteConsumer.headers,
		changed: "COALESCE(status_changed_at, '1970-01-01 00:00:00')",
		// A value written as text would count characters: the cast counts bytes.
		size:     func(col string) string { return "length(CAST(" + col + " AS BLOB))" },
		bindTime: sqliteConsumer.failTime, contains: sqliteConsumer.contains,
	}
}

// DeadLetterSummary is a dead letter as a list shows it: Message.Body, Message.Headers and
// Raw are left out (nil), its text columns are cut (see [ListTextMax]), and BodyBytes and
// RawBytes say how large what was left out is.
type DeadLetterSummary struct {
	deadletter.Entry
	BodyBytes int64
	// RawBytes is the size of the raw evidence; 0 when the entry has none.
	RawBytes int64
}

// DeadLetterSummaries lists n's dead letters that match f, in ID order (f.Limit: default
// 100, at most 10,000), as [DeadLetterSummary] values.
func DeadLetterSummaries(ctx context.Context, d Dialect, q Querier, n *Names, f deadletter.Filter) ([]DeadLetterSummary, error) {
	v := viewSQL(d)
	where, args, limit := listWhere(f, v.bindTime, v.contains)
	args = append(args, limit)
	cut := func(col string, max int) string { return "substr(" + col + ", 1, " + strconv.Itoa(max+1) + ")" }
	query := "SELECT id, " + v.eventID + ", " + cut("event_type", ListTextMax) + ", " + cut("event_key", ListTextMax) + ", " +
		cut("content_type", ListTextMax) + ", " + v.size("body") + ", created_at, stage, kind, " + cut("consumer", ListTextMax) + ", " +
		cut("reason", ListReasonMax) + ", attempts, first_failed_at, last_failed_at, status, " + v.changed + ", " +
		cut("broker_message_id", ListTextMax) + ", COALESCE(" + v.size("raw") + ", 0) FROM " + n.DeadLetters +
		" WHERE " + strings.Join(where, " AND ") + " ORDER BY id LIMIT ?"
	rows, err := q.Query(ctx, d.ops().rebind(query), args...)
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
		m.Type, m.Key, m.ContentType = cutText(m.Type, ListTextMax), cutText(m.Key, ListTextMax), cutText(m.ContentType, ListTextMax)
		s.Consumer, s.Reason = cutText(s.Consumer, ListTextMax), cutText(s.Reason, ListReasonMax)
		s.BrokerMessageID = cutText(s.BrokerMessageID, ListTextMax)
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
	v := viewSQL(d)
	var p DeadLetterPreview
	found, err := scanRow(ctx, q, []any{&p.BodyBytes, &p.RawBytes}, d.ops().rebind("SELECT "+v.size("body")+", COALESCE("+v.size("raw")+", 0) FROM "+
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
		", attempts, first_failed_at, last_failed_at, status, " + v.changed + ", " + text("broker_message_id") + ", " + bin("raw") +
		", COALESCE(held_seq, 0) FROM " + n.DeadLetters + " WHERE id = ?"
	rows, err := q.Query(ctx, d.ops().rebind(query), id)
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
	v := viewSQL(d)
	total = -1
	found, err = scanRow(ctx, q, []any{&chunk, &total}, d.ops().rebind("SELECT substr("+column+", ?, ?), COALESCE("+v.size(column)+", -1) FROM "+
		n.DeadLetters+" WHERE id = ?"), offset+1, size, id)
	if err != nil {
		return nil, 0, false, fmt.Errorf("reading the %s of dead letter %d of %s: %w", column, id, n.Outbox, err)
	}
	if !found || total < 0 {
		return nil, 0, false, nil
	}
	return chunk, total, true, nil
}

// scanRow scans the first row of a query into dest, and reports whether there was one.
func scanRow(ctx context.Context, q Querier, dest []any, query string, args ...any) (bool, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return false, rows.Err()
	}
	if err := rows.Scan(dest...); err != nil {
		return false, err
	}
	return true, rows.Err()
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
