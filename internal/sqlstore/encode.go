package sqlstore

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
)

// This file turns messages and seqs into statement arguments and multi-row statements, the
// same way for every dialect.

// insertColumns is the column list every dialect's INSERT writes, in messageArgs order.
const insertColumns = "(id, type, key, headers, content_type, body, created_at)"

// messageArgs returns m's INSERT arguments in insertColumns order: plain strings, bytes and
// times, which every driver binds; an empty body for a nil one (the column is NOT NULL).
func messageArgs(m outbox.Message) []any {
	if m.Body == nil {
		m.Body = []byte{}
	}
	return []any{m.ID.String(), m.Type, m.Key, HeadersJSON(m.Headers), m.ContentType, m.Body, m.CreatedAt}
}

// insertChunks splits msgs into INSERT statements of at most maxRows rows and, past the
// first row, maxBytes of bodies: large batches stay under the server's packet limit.
func insertChunks(msgs []outbox.Message, maxRows, maxBytes int, fn func([]outbox.Message) error) error {
	for len(msgs) > 0 {
		n, size := 0, 0
		for n < len(msgs) && n < maxRows {
			size += len(msgs[n].Body)
			if n > 0 && size > maxBytes {
				break
			}
			n++
		}
		if err := fn(msgs[:n]); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// checkLen fails, naming the limit, when a field is longer than its column allows; MySQL in
// non-strict mode would otherwise truncate it silently.
func checkLen(m outbox.Message, field, value string, limit int) error {
	if n := utf8.RuneCountInString(value); n > limit {
		return fmt.Errorf("outbox: event %s: %s is %d characters, over the column limit of %d", m.ID, field, n, limit)
	}
	return nil
}

var repeatedSQL sync.Map // head, tuple, sep, rows → statement

// valuesSQL builds (and caches) head followed by rows copies of tuple, comma-separated.
func valuesSQL(head, tuple string, rows int) string { return repeatSQL(head, tuple, ",", rows) }

// repeatSQL builds (and caches) head followed by rows copies of tuple separated by sep.
func repeatSQL(head, tuple, sep string, rows int) string {
	key := head + "\x00" + tuple + "\x00" + sep + "\x00" + strconv.Itoa(rows)
	if s, ok := repeatedSQL.Load(key); ok {
		return s.(string)
	}
	var b strings.Builder
	b.Grow(len(head) + rows*(len(tuple)+len(sep)))
	b.WriteString(head)
	for r := range rows {
		if r > 0 {
			b.WriteString(sep)
		}
		b.WriteString(tuple)
	}
	s := b.String()
	repeatedSQL.Store(key, s)
	return s
}

// joinSeqs renders seqs as "1,2,3": one text argument that every driver binds, where array
// arguments are driver-specific.
func joinSeqs(seqs []int64) string {
	b := make([]byte, 0, 8*len(seqs))
	for i, s := range seqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, s, 10)
	}
	return string(b)
}

// inSeqs renders "seq IN (1,2,3)", or a condition no row meets for no seqs. Splicing is
// safe: the values are formatted integers.
func inSeqs(seqs []int64) string {
	if len(seqs) == 0 {
		return "1 = 0"
	}
	return "seq IN (" + joinSeqs(seqs) + ")"
}

// jsonRetries encodes a Retry write-back as one JSON argument, for dialects that read
// per-row values from it (PostgreSQL's jsonb_to_recordset, SQLite's json_each), each error
// made storable under lim (a broker's error text may hold anything).
func jsonRetries(rs []outboxdriver.Retry, lim textLimits) string {
	type row struct {
		Seq     int64  `json:"seq"`
		DelayMS int64  `json:"delay_ms"`
		Error   string `json:"error"`
	}
	out := make([]row, len(rs))
	for i, r := range rs {
		msg, _ := cleanText(r.Error, 0, lim.bytes)
		out[i] = row{r.Seq, r.Delay.Milliseconds(), msg}
	}
	js, _ := json.Marshal(out) // strings and integers always encode
	return string(js)
}
