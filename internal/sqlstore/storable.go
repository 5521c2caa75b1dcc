package sqlstore

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox/deadletter"
)

// This file makes any dead letter storable and writes it: a poison message must never loop
// because the table refuses it.

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

// dlWriter inserts dead-letter rows into one dialect's table.
type dlWriter struct {
	sql   *dialectSQL
	table string
}

func (w dlWriter) args(r dlRow) []any {
	return []any{r.eventID, r.typ, r.key, r.headers, r.contentType, r.body, w.sql.bindCreated(r.createdAt),
		r.stage, r.kind, r.consumer, r.reason, r.attempts, w.sql.bindTime(r.firstFailedAt), w.sql.bindTime(r.lastFailedAt),
		r.brokerMsgID, r.raw, r.heldSeq}
}

func (w dlWriter) insert(ctx context.Context, q Querier, rows []dlRow) error {
	for len(rows) > 0 {
		chunk := rows[:min(len(rows), w.sql.dlMaxRows)]
		rows = rows[len(chunk):]
		args := make([]any, 0, dlColumnCount*len(chunk))
		for _, r := range chunk {
			args = append(args, w.args(r)...)
		}
		query := valuesSQL("INSERT INTO "+w.table+" "+dlColumns+" VALUES ", w.sql.dlTuple, len(chunk))
		if err := q.Exec(ctx, w.sql.rebind(query), args...); err != nil {
			return err
		}
	}
	return nil
}

// add stores one entry. If the table refuses its storable row while ctx is live, the entry
// is stored in its minimal form instead (see minimalRow), so a dead letter whose content the
// table refuses never makes its message loop; an error means the table is unreachable (or
// not migrated). An entry added holds nothing: only the relay's write-back holds rows.
func (w dlWriter) add(ctx context.Context, db Querier, e deadletter.Entry) error {
	e.HeldSeq = 0
	err := w.insert(ctx, db, []dlRow{storableRow(e, w.sql.lim)})
	if err == nil || ctx.Err() != nil || !refusedContent(err) {
		return err
	}
	if err2 := w.insert(ctx, db, []dlRow{minimalRow(e, w.sql.lim, err)}); err2 != nil {
		return fmt.Errorf("storing a dead letter: %w (its minimal form failed too: %v)", err, err2)
	}
	return nil
}
