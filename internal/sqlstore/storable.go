package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
)

// This file makes any dead letter storable, and reads back any row: a poison message must
// never loop because the table refuses it, and one spoiled outbox or dead-letter row must
// never fail the reads of the others.

// textLimits are what a dialect's dead-letter columns hold; zero means no limit.
type textLimits struct {
	// chars bounds the short text columns (type, key, content type, consumer, kind, broker
	// message ID), in characters: MySQL's VARCHAR(255).
	chars int
	// bytes bounds the long text columns (reason, last_error), in bytes: MySQL's TEXT.
	bytes int
	// minTime and maxTime bound the time columns (MySQL's DATETIME: years 1000 to 9999).
	minTime, maxTime time.Time
}

var (
	pgLimits    = textLimits{}
	mysqlLimits = textLimits{
		chars:   255,
		bytes:   65535,
		minTime: time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC),
		maxTime: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
	}
	sqliteLimits = textLimits{}
)

// cleanText returns s as every text column stores it: invalid UTF-8 replaced by U+FFFD,
// NUL bytes dropped (PostgreSQL refuses both), and at most maxChars characters and maxBytes
// bytes (0: no limit), a cut value ending in "…". It reports whether s changed.
func cleanText(s string, maxChars, maxBytes int) (string, bool) {
	out := s
	if !utf8.ValidString(out) {
		out = strings.ToValidUTF8(out, "\uFFFD")
	}
	if strings.IndexByte(out, 0) >= 0 {
		out = strings.ReplaceAll(out, "\x00", "")
	}
	const ellipsis = "…"
	if maxChars > 0 && utf8.RuneCountInString(out) > maxChars {
		cut, n := 0, 0
		for i := range out {
			if n == maxChars-1 {
				cut = i
				break
			}
			n++
		}
		out = out[:cut] + ellipsis
	}
	if maxBytes > 0 && len(out) > maxBytes {
		cut := maxBytes - len(ellipsis)
		for cut > 0 && !utf8.RuneStart(out[cut]) {
			cut--
		}
		out = out[:cut] + ellipsis
	}
	return out, out != s
}

// cleanHeaders returns h's storable JSON (nil for none), and whether a name or value
// had to change.
func cleanHeaders(h map[string]string) (any, bool) {
	if len(h) == 0 {
		return nil, false
	}
	altered := false
	clean := make(map[string]string, len(h))
	for k, v := range h {
		ck, kc := cleanText(k, 0, 0)
		cv, vc := cleanText(v, 0, 0)
		if _, dup := clean[ck]; dup {
			kc = true
		}
		clean[ck] = cv
		altered = altered || kc || vc
	}
	return HeadersJSON(clean), altered
}

// dlRow is one dead-letter row, ready to bind.
type dlRow struct {
	eventID                                    any // the UUID's text, or nil
	typ, key, contentType                      string
	headers                                    any // JSON text, or nil
	body                                       []byte
	createdAt                                  time.Time
	stage, kind, consumer, reason, brokerMsgID string
	attempts                                   int
	firstFailedAt, lastFailedAt                time.Time
	raw                                        any // the Raw's text, or nil
	heldSeq                                    any // the outbox row held, or nil
}

// storableRow makes e storable under lim. Every text field is cleaned and cut to its
// column; a time out of range becomes the failure time. When anything changed, or e came
// with a Raw, the raw column keeps the entry as it came.
func storableRow(e deadletter.Entry, lim textLimits) dlRow {
	m := e.Message
	now := time.Now().UTC()
	r := dlRow{
		body:     m.Body,
		stage:    string(e.Stage),
		attempts: e.Attempts,
		heldSeq:  heldSeq(e),
	}
	if r.body == nil {
		r.body = []byte{}
	}
	if m.ID != uuid.Nil {
		r.eventID = m.ID.String()
	}
	var changed [9]bool
	r.typ, changed[0] = cleanText(m.Type, lim.chars, 0)
	r.key, changed[1] = cleanText(m.Key, lim.chars, 0)
	r.contentType, changed[2] = cleanText(m.ContentType, lim.chars, 0)
	r.consumer, changed[3] = cleanText(e.Consumer, lim.chars, 0)
	r.brokerMsgID, changed[4] = cleanText(e.BrokerMessageID, lim.chars, 0)
	r.reason, changed[5] = cleanText(e.Reason, 0, lim.bytes)
	r.headers, changed[6] = cleanHeaders(m.Headers)
	r.kind, changed[7] = cleanText(string(e.Kind), lim.chars, 0)
	r.firstFailedAt = orNow(e.FirstFailedAt, now)
	r.lastFailedAt = orNow(e.LastFailedAt, now)
	r.createdAt, changed[8] = storableTime(m.CreatedAt, r.lastFailedAt, lim)

	if e.Raw == nil && changed == [9]bool{} {
		return r
	}
	raw := originals(e)
	if changed[8] {
		raw.CreatedAt = m.CreatedAt.Format(time.RFC3339Nano)
	}
	r.raw = rawText(raw)
	return r
}

// minimalRow is the fallback when the table refused e's storable row anyway (a schema
// changed by hand, a value past the server's packet size): fixed placeholders in every text
// field, no headers, no body, and the raw column holding the whole entry, body included.
// Only a table that is down refuses it.
func minimalRow(e deadletter.Entry, lim textLimits, refused error) dlRow {
	now := time.Now().UTC()
	raw := originals(e)
	if raw.Body == nil {
		raw.Body = e.Message.Body
		if raw.Body == nil {
			raw.Body = []byte{}
		}
	}
	if !e.Message.CreatedAt.IsZero() {
		raw.CreatedAt = e.Message.CreatedAt.Format(time.RFC3339Nano)
	}
	reason, _ := cleanText("the dead-letter table refused this entry as it was, so its fields are in its raw column; the database said: "+refused.Error(), 0, 4096)
	stage := e.Stage
	if stage != deadletter.StageRelay {
		stage = deadletter.StageConsumer
	}
	r := dlRow{
		typ:           "(see raw)",
		body:          []byte{},
		createdAt:     now,
		stage:         string(stage),
		reason:        reason,
		attempts:      e.Attempts,
		firstFailedAt: now,
		lastFailedAt:  now,
		raw:           rawText(raw),
		heldSeq:       heldSeq(e), // the row stays held: its entry must say so
	}
	if e.Message.ID != uuid.Nil {
		r.eventID = e.Message.ID.String()
	}
	r.kind, _ = cleanText(string(e.Kind), lim.chars, 0)
	r.consumer, _ = cleanText(e.Consumer, lim.chars, 0)
	return r
}

// originals returns e's Raw (a copy) with every field e holds filled in as it came.
func originals(e deadletter.Entry) deadletter.Raw {
	var raw deadletter.Raw
	if e.Raw != nil {
		raw = *e.Raw
		raw.Headers = maps.Clone(raw.Headers)
		raw.Attributes = maps.Clone(raw.Attributes)
	}
	m := e.Message
	fill := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	if m.ID != uuid.Nil {
		fill(&raw.ID, m.ID.String())
	}
	fill(&raw.Type, m.Type)
	fill(&raw.Key, m.Key)
	fill(&raw.ContentType, m.ContentType)
	fill(&raw.Consumer, e.Consumer)
	fill(&raw.Reason, e.Reason)
	fill(&raw.BrokerMessageID, e.BrokerMessageID)
	if raw.Headers == nil && raw.HeadersText == "" && len(m.Headers) > 0 {
		raw.Headers = maps.Clone(m.Headers)
	}
	if raw.Body != nil && bytes.Equal(raw.Body, m.Body) {
		raw.Body = nil // the body column has it
	}
	return raw
}

// heldSeq binds e's HeldSeq: NULL when it holds nothing.
func heldSeq(e deadletter.Entry) any {
	if e.HeldSeq == 0 {
		return nil
	}
	return e.HeldSeq
}

// refusedContent reports whether err, from a dead-letter insert, may be the table refusing
// the row's content (a constraint, a value too large), which its minimal form may pass;
// not a table that is missing or a database that is down, which it would not.
func refusedContent(err error) bool { return !schemaMissing(err) && !databaseUnavailable(err) }

func rawText(r deadletter.Raw) any {
	b, _ := r.MarshalText() // never fails
	return b
}

func orNow(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t.UTC()
}

// storableTime returns t, or fallback when t is zero or outside what the columns hold
// (reporting the change in the latter case).
func storableTime(t, fallback time.Time, lim textLimits) (time.Time, bool) {
	if t.IsZero() {
		return fallback, false
	}
	t = t.UTC()
	if !lim.minTime.IsZero() && t.Before(lim.minTime) || !lim.maxTime.IsZero() && t.After(lim.maxTime) {
		return fallback, true
	}
	return t, false
}

// dlColumns are the dead-letter columns every insert writes, in dlRow.args order.
const dlColumns = "(event_id, event_type, event_key, headers, content_type, body, created_at, stage, kind, consumer, reason, attempts, first_failed_at, last_failed_at, broker_message_id, raw, held_seq)"

// dlColumnCount is how many columns dlColumns names: the placeholders of one row.
const dlColumnCount = 17

// dlWriter inserts dead-letter rows in one dialect.
type dlWriter struct {
	table    string
	lim      textLimits
	tuple    func(row int) string  // the placeholders of one row
	time     func(t time.Time) any // binds created_at the way the table stores it
	failTime func(t time.Time) any // binds a failure time the way the database clock writes it
	maxRow   int                   // rows per statement, under the dialect's parameter limit
}

func (w *dlWriter) args(r dlRow) []any {
	return []any{r.eventID, r.typ, r.key, r.headers, r.contentType, r.body, w.time(r.createdAt),
		r.stage, r.kind, r.consumer, r.reason, r.attempts, w.failTime(r.firstFailedAt), w.failTime(r.lastFailedAt),
		r.brokerMsgID, r.raw, r.heldSeq}
}

func (w *dlWriter) insert(ctx context.Context, q Querier, rows []dlRow) error {
	for len(rows) > 0 {
		chunk := rows[:min(len(rows), w.maxRow)]
		rows = rows[len(chunk):]
		var b strings.Builder
		b.WriteString("INSERT INTO " + w.table + " " + dlColumns + " VALUES ")
		args := make([]any, 0, dlColumnCount*len(chunk))
		for i, r := range chunk {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(w.tuple(i))
			args = append(args, w.args(r)...)
		}
		if err := q.Exec(ctx, b.String(), args...); err != nil {
			return err
		}
	}
	return nil
}

// add stores one entry. If the table refuses its storable row while ctx is live, the entry
// is stored in its minimal form instead (see minimalRow), so a dead letter whose content the
// table refuses never makes its message loop; an error means the table is unreachable (or
// not migrated). An entry added holds nothing: only the relay's write-back holds rows.
func (w *dlWriter) add(ctx context.Context, db Querier, e deadletter.Entry) error {
	e.HeldSeq = 0
	err := w.insert(ctx, db, []dlRow{storableRow(e, w.lim)})
	if err == nil || ctx.Err() != nil || !refusedContent(err) {
		return err
	}
	if err2 := w.insert(ctx, db, []dlRow{minimalRow(e, w.lim, err)}); err2 != nil {
		return fmt.Errorf("storing a dead letter: %w (its minimal form failed too: %v)", err, err2)
	}
	return nil
}

// moveDeadLetters is the relay's DeadLetter write-back for every dialect: in one
// transaction, take reads the claim's rows (with their first and last failure times, by the
// database clock) and deletes them, or holds those of dead letters with HoldKey (see
// hold.go), and they are inserted as dead letters, a held row's with its seq. Rows are read
// leniently, so an unreadable row keeps its raw values (and holds its key like any other).
// If the table refuses the rows, the transaction is run again with their minimal forms.
func (w *dlWriter) moveDeadLetters(ctx context.Context, db DB, dead []outboxdriver.DeadLetter,
	take func(ctx context.Context, q Querier) ([]failedRow, error)) ([]int64, error) {
	byseq := make(map[int64]outboxdriver.DeadLetter, len(dead))
	for _, d := range dead {
		byseq[d.Seq] = d
	}
	var moved []int64
	run := func(refused error) error {
		return inTxReadCommitted(ctx, db, func(q Querier) error {
			taken, err := take(ctx, q)
			moved = moved[:0]
			if err != nil || len(taken) == 0 {
				return err
			}
			rows := make([]dlRow, len(taken))
			for i, t := range taken {
				moved = append(moved, t.seq)
				e := t.entry(byseq[t.seq])
				if t.held {
					e.HeldSeq = t.seq
				}
				if refused == nil {
					rows[i] = storableRow(e, w.lim)
				} else {
					rows[i] = minimalRow(e, w.lim, refused)
				}
			}
			return w.insert(ctx, q, rows)
		})
	}
	err := run(nil)
	if err == nil {
		return moved, nil
	}
	if ctx.Err() != nil || !refusedContent(err) {
		return nil, err
	}
	if err2 := run(err); err2 != nil {
		return nil, fmt.Errorf("moving %d row(s) to the dead-letter table: %w (their minimal forms failed too: %v)", len(dead), err, err2)
	}
	return moved, nil
}

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
		if err := json.Unmarshal([]byte(r.headers), &m.Headers); err != nil {
			m.Headers = nil
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

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) <= 200 {
		return s
	}
	c, _ := cleanText(s, 200, 0)
	return c
}

// failedRow is an outbox row taken for the dead-letter table, with its failure times, and
// whether it stays in the outbox, held.
type failedRow struct {
	outboxRow
	firstFailedAt, lastFailedAt lenientTime
	held                        bool
}

func (r *failedRow) dest() []any {
	return append(r.outboxRow.dest(), &r.firstFailedAt, &r.lastFailedAt)
}

// entry builds the dead letter of r. A row that could not be read keeps its columns as
// they were in the entry's Raw.
func (r *failedRow) entry(d outboxdriver.DeadLetter) deadletter.Entry {
	m, err := r.message()
	e := deadletter.Entry{
		Message:       m,
		Stage:         deadletter.StageRelay,
		Kind:          deadletter.Kind(d.Kind),
		Reason:        d.Reason,
		Attempts:      r.attempts,
		FirstFailedAt: r.firstFailedAt.t,
		LastFailedAt:  r.lastFailedAt.t,
	}
	if err != nil {
		e.Raw = &deadletter.Raw{ID: r.id, Type: r.typ, Key: r.key, ContentType: r.contentType, CreatedAt: r.createdAt.text}
		if m.Headers == nil {
			e.Raw.HeadersText = r.headers
		}
		if e.Kind == "" {
			e.Kind = deadletter.KindUnreadableRow
		}
	}
	return e
}

// scanFailed reads the rows of a dead-letter write-back's take statement; with held, each
// row ends with a boolean column: whether it stays in the outbox, held.
func scanFailed(rows Rows, held bool) ([]failedRow, error) {
	defer rows.Close()
	var out []failedRow
	for rows.Next() {
		var r failedRow
		dest := r.dest()
		if held {
			dest = append(dest, &r.held)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// lenientTime scans a time given as time.Time or as text and never fails: text it cannot
// read is kept, with the reason, for the caller to report.
type lenientTime struct {
	t    time.Time
	text string // the text as read, when it was text
	err  error
}

func (l *lenientTime) Scan(src any) error {
	*l = lenientTime{}
	var at anyTime
	switch v := src.(type) {
	case nil:
		return nil
	case []byte:
		l.text = string(v)
	case string:
		l.text = v
	case time.Time:
		l.t = v.UTC()
		return nil
	default:
		l.text = fmt.Sprint(v)
	}
	if err := at.Scan(l.text); err != nil {
		l.err = fmt.Errorf("%q is not a time", clip(l.text))
		return nil
	}
	l.t = at.t
	return nil
}

var _ sql.Scanner = (*lenientTime)(nil)
