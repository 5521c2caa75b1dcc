package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
)

// This file reads rows back, whatever a driver returns for them: one row of a query,
// times as times or as text (SQLite's TEXT columns, MySQL without parseTime), and the
// outbox rows of a claim, read so that one spoiled row never fails the others.

// scanRow scans the first row of a query into dest (nothing for none) and reports whether
// there was one.
func scanRow(ctx context.Context, q Querier, dest []any, query string, args ...any) (bool, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return false, rows.Err()
	}
	if len(dest) > 0 {
		if err := rows.Scan(dest...); err != nil {
			return false, err
		}
	}
	return true, rows.Err()
}

// lenientTime scans a time given as time.Time or as text (text without a zone is UTC) and
// never fails: text it cannot read is kept, with the reason, for the caller to report (a
// spoiled row) or to fail with (see strictTimes).
type lenientTime struct {
	t    time.Time
	text string // the text as read, when it was text
	err  error
}

var textTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07", // PostgreSQL's text output of a timestamptz at a whole-hour offset
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999 -0700 MST",
}

func (l *lenientTime) Scan(src any) error {
	*l = lenientTime{}
	switch v := src.(type) {
	case nil:
		return nil
	case time.Time:
		l.t = v.UTC()
		return nil
	case []byte:
		l.text = string(v)
	case string:
		l.text = v
	default:
		l.text = fmt.Sprint(v)
	}
	for _, layout := range textTimeLayouts {
		if t, err := time.Parse(layout, l.text); err == nil {
			l.t = t.UTC()
			return nil
		}
	}
	l.err = fmt.Errorf("%q is not a time", clip(l.text))
	return nil
}

var _ sql.Scanner = (*lenientTime)(nil)

// strictTimes returns the reason the first of ts that could not be read was not a time:
// for reads where such a time is the database's fault, not one row's.
func strictTimes(ts ...*lenientTime) error {
	for _, t := range ts {
		if t.err != nil {
			return t.err
		}
	}
	return nil
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) <= 200 {
		return s
	}
	c, _ := cleanText(s, 200, 0)
	return c
}

// claimColumns are the columns of a claim's rows, in scanClaimed order: those of PostgreSQL's
// claim function, and the same columns of the outbox in MySQL's and SQLite's claims.
const claimColumns = "seq, id, type, key, headers, content_type, body, created_at, attempts, first_failed_at"

// outboxRow is one outbox row as the database returned it, before it is parsed, so that a
// row written by raw SQL, a trigger or another producer cannot fail the read of the
// others: the claim returns it with Claimed.Err, the dead-letter write-back keeps its raw
// values.
type outboxRow struct {
	seq                                int64
	id, typ, key, headers, contentType string
	body                               []byte
	createdAt                          lenientTime
	attempts                           int
}

// dest are the scan targets of the claim's result columns: seq, id, type, key, headers,
// content_type, body, created_at, attempts.
func (r *outboxRow) dest() []any {
	return []any{&r.seq, &r.id, &r.typ, &r.key, &r.headers, &r.contentType, &r.body, &r.createdAt, &r.attempts}
}

// message parses r. The error names each column that could not be read, or the rule of
// outbox.Message the row breaks; the message holds what could be read.
func (r *outboxRow) message() (outbox.Message, error) {
	m := outbox.Message{Type: r.typ, Key: r.key, ContentType: r.contentType, Body: r.body}
	var problems []string
	var err error
	if m.ID, err = uuid.Parse(r.id); err != nil { // parses the string in place: no copy to []byte
		problems = append(problems, fmt.Sprintf("column id: %q is not a UUID", r.id))
	}
	if r.headers != "" {
		if m.Headers, err = decodeHeaders(r.headers); err != nil {
			problems = append(problems, fmt.Sprintf("column headers: %s is not a JSON object of strings (%v)", clip(r.headers), err))
		}
	}
	m.CreatedAt = r.createdAt.t
	if r.createdAt.err != nil {
		problems = append(problems, "column created_at: "+r.createdAt.err.Error())
	}
	if len(problems) == 0 {
		if err := m.Validate(); err != nil {
			return m, err
		}
		return m, nil
	}
	return m, errors.New(strings.Join(problems, "; "))
}

// scanFirstCap is the size of a claim's result at its first row outside a backlog (it
// grows from there); scanMaxCap bounds what a backlog's claim allocates at once.
const scanFirstCap, scanMaxCap = 16, 10000

// scanClaimed reads claimed rows (claimColumns, then the columns of tail) and returns them in
// outbox order. A row that cannot be read into a valid message does not fail the others: it
// comes back with Claimed.Err naming the column and the problem, for the relay to
// dead-letter alone. limit is the claim's; backlog says that the loop's last claim came back
// full, so this one likely is too: its result is sized for limit rows at once instead of
// growing, and copying its large elements, row by row. An empty claim allocates nothing:
// most of an idle relay's claims are empty, and a result sized for 500 rows is 100 KB (in a
// group of 50 quiet outboxes, 80 % of all the process allocated). each, if not nil, is
// called after each row is read (into tail).
func scanClaimed(rows Rows, limit int, backlog bool, each func(), tail ...any) ([]outboxdriver.Claimed, error) {
	defer rows.Close()
	var (
		out   []outboxdriver.Claimed
		r     outboxRow
		first lenientTime                                 // first_failed_at: a time the relay wrote, or NULL
		dest  = append(append(r.dest(), &first), tail...) // one row and its targets for all: message copies what it keeps
	)
	for rows.Next() {
		r = outboxRow{}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if each != nil {
			each()
		}
		c := outboxdriver.Claimed{Seq: r.seq, Attempts: r.attempts, FirstFailedAt: first.t}
		c.Message, c.Err = r.message()
		if out == nil {
			size := scanFirstCap
			if backlog {
				size = min(limit, scanMaxCap)
			}
			out = make([]outboxdriver.Claimed, 0, size)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	bySeq := func(a, b outboxdriver.Claimed) int { return cmp.Compare(a.Seq, b.Seq) }
	// Claims mostly arrive in order already: one pass to check beats sorting big structs.
	if !slices.IsSortedFunc(out, bySeq) {
		slices.SortFunc(out, bySeq)
	}
	return out, nil
}
