package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/outbox"
)

// leaseStore is the relay store of the dialects without a server-side claim function (MySQL,
// SQLite): the same write-backs as PostgreSQL's, as plain statements. Each dialect supplies
// its claim and the two statements that carry a value per row.
type leaseStore struct {
	db DB
	n  *Names
	// claim leases rows; the dialect owns how claims are serialised.
	claim func(ctx context.Context, s *leaseStore, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error)
	// retry returns the statement, and its arguments, that releases rows for another
	// attempt after their delay with their error, if they still carry token.
	retry func(token int64, rs []outboxdriver.Retry) (string, []any)
	// take reads, inside DeadLetter's transaction, the rows hold and drop that still carry
	// token, in failedRow's columns; it holds the keyed rows of hold (heldAt, no lease:
	// see hold.go) and deletes the others.
	take func(ctx context.Context, q Querier, token int64, hold, drop []int64) ([]failedRow, error)
	// dl writes the dialect's dead letters.
	dl *dlWriter
	// now is the dialect's expression for the database clock; held is a held row's
	// available_at (heldAt).
	now, held string
	// key is the quoted key column (a reserved word in MySQL).
	key string
	// heads is the dialect's loose index scan over (key, seq); see planDeep.
	heads runHeads
}

func (s *leaseStore) Stats(ctx context.Context) (outboxdriver.Stats, error) {
	return readStats(ctx, s.db, s.n)
}

func (s *leaseStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	return s.claim(ctx, s, p)
}

// inSeqs renders "seq IN (1,2,3)", or a condition no row meets for no seqs. Splicing is
// safe: the values are formatted integers.
func inSeqs(seqs []int64) string {
	if len(seqs) == 0 {
		return "1 = 0"
	}
	return "seq IN (" + JoinSeqs(seqs) + ")"
}

func (s *leaseStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.db.Exec(ctx, "DELETE FROM "+s.n.Outbox+" WHERE claim_token = ? AND "+inSeqs(seqs), token)
}

func (s *leaseStore) Release(ctx context.Context, token int64, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.db.Exec(ctx, "UPDATE "+s.n.Outbox+
		" SET claim_token = NULL, lease_owner = NULL, lease_until = NULL, attempts = attempts - 1"+
		" WHERE claim_token = ? AND "+inSeqs(seqs), token)
}

// Retry records each error made storable (a broker's error text may hold anything).
func (s *leaseStore) Retry(ctx context.Context, token int64, retries []outboxdriver.Retry) error {
	if len(retries) == 0 {
		return nil
	}
	clean := make([]outboxdriver.Retry, len(retries))
	for i, r := range retries {
		clean[i] = r
		clean[i].Error, _ = cleanText(r.Error, 0, s.dl.lim.bytes)
	}
	query, args := s.retry(token, clean)
	return s.db.Exec(ctx, query, args...)
}

// DeadLetter moves the rows to the dead-letter table in one transaction: take locks and
// reads them, and deletes them or holds them (HoldKey), and they are inserted made storable
// (see dlWriter.moveDeadLetters). The first statement locks the rows, so they stay this
// claim's until it commits. A claim that planned a run through a row being held finds it
// locked or no longer free, and ends the run there (keepRuns), as for a Retry.
func (s *leaseStore) DeadLetter(ctx context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	if len(dead) == 0 {
		return nil, nil
	}
	hold, drop := holdSplit(dead)
	return s.dl.moveDeadLetters(ctx, s.db, dead, func(ctx context.Context, q Querier) ([]failedRow, error) {
		return s.take(ctx, q, token, hold, drop)
	})
}

// holdRows is the statement that holds the rows of seqs (still carrying token, keyed).
func (s *leaseStore) holdRows(seqs []int64) string {
	return "UPDATE " + s.n.Outbox + " SET available_at = " + s.held +
		", claim_token = NULL, lease_owner = NULL, lease_until = NULL WHERE claim_token = ? AND " + s.key + " <> '' AND " + inSeqs(seqs)
}

// failedColumns are the columns of a DeadLetter write-back's read, in failedRow order.
func (s *leaseStore) failedColumns(headers string) string {
	return "seq, id, type, " + s.key + ", " + headers + ", content_type, body, created_at, attempts, COALESCE(first_failed_at, " + s.now + "), " + s.now
}

// textTimeRows lets ScanClaimed read times that a driver returns as text (SQLite's TEXT
// columns, MySQL without parseTime=true) as well as time.Time.
type textTimeRows struct{ Rows }

func (r textTimeRows) Scan(dest ...any) error {
	var (
		targets []*time.Time
		scans   []*anyTime
	)
	d := dest
	for i, x := range dest {
		t, ok := x.(*time.Time)
		if !ok {
			continue
		}
		if targets == nil {
			d = append([]any(nil), dest...)
		}
		at := &anyTime{}
		d[i] = at
		targets = append(targets, t)
		scans = append(scans, at)
	}
	if err := r.Rows.Scan(d...); err != nil {
		return err
	}
	for i, t := range targets {
		*t = scans[i].t
	}
	return nil
}

// anyTime scans a time stored as time.Time or as text, taking text without a zone as UTC.
type anyTime struct{ t time.Time }

var textTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999 -0700 MST",
}

func (a *anyTime) Scan(src any) error {
	var s string
	switch v := src.(type) {
	case nil:
		a.t = time.Time{}
		return nil
	case time.Time:
		a.t = v.UTC()
		return nil
	case []byte:
		s = string(v)
	case string:
		s = v
	default:
		return fmt.Errorf("cannot read %T as a time", src)
	}
	for _, layout := range textTimeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			a.t = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("cannot read %q as a time", s)
}

var _ sql.Scanner = (*anyTime)(nil)

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

// splitStatements cuts a migration into statements for drivers that run one per call: a
// statement ends with a line whose last character is ';'. Comment-only chunks are dropped.
func splitStatements(script string) []string {
	var (
		out []string
		cur strings.Builder
	)
	flush := func() {
		stmt := strings.TrimSpace(cur.String())
		cur.Reset()
		for _, line := range strings.Split(stmt, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
				out = append(out, strings.TrimSuffix(stmt, ";"))
				return
			}
		}
	}
	for line := range strings.SplitSeq(script, "\n") {
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(strings.TrimRight(line, " \t\r"), ";") {
			flush()
		}
	}
	flush()
	return out
}

// statements runs a multi-statement script (a migration) one statement at a time.
type statements struct{ Querier }

func (q statements) Exec(ctx context.Context, query string, args ...any) error {
	if len(args) > 0 {
		return q.Querier.Exec(ctx, query, args...)
	}
	for _, stmt := range splitStatements(query) {
		if err := q.Querier.Exec(ctx, stmt); err != nil {
			return err
		}
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
