package sqlstore

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
)

//go:embed migrations
var migrationFiles embed.FS

// Postgres is the PostgreSQL dialect (12 and later).
var Postgres Dialect = postgres{}

type postgres struct{}

func (postgres) Name() string { return "postgres" }

func (postgres) Quote(ident string) string { return `"` + ident + `"` }

func (d postgres) Migrations() []Migration { return loadMigrations("postgres") }

func (d postgres) Migrate(ctx context.Context, db DB, n *Names) error {
	return db.InTx(ctx, func(q Querier) error {
		if err := q.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", n.MigrateKey); err != nil {
			return err
		}
		return runMigrations(ctx, d, q, n)
	})
}

func (d postgres) books(n *Names) books {
	b := books{
		table: "CREATE TABLE IF NOT EXISTS " + n.Migrations + " (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
		now:   "now()",
	}
	if n.Schema != "" {
		b.schema = "CREATE SCHEMA IF NOT EXISTS " + d.Quote(n.Schema)
	}
	return b
}

// claimColumns are the columns of a claim's rows, in ScanClaimed order: those of the claim
// function's table (MySQL's and SQLite's claims read the same columns of their tables).
const claimColumns = "seq, id, type, key, headers, content_type, body, created_at, attempts, first_failed_at"

// insertColumns is the column list every dialect's INSERT writes, in argument order.
const insertColumns = "(id, type, key, headers, content_type, body, created_at)"

// MessageArgs returns m's INSERT arguments in insertColumns order: plain strings, bytes and
// times, which every driver binds.
func MessageArgs(m outbox.Message) []any {
	return []any{m.ID.String(), m.Type, m.Key, HeadersJSON(m.Headers), m.ContentType, m.Body, m.CreatedAt}
}

// HeadersJSON encodes headers for storage; nil for none.
func HeadersJSON(h map[string]string) any {
	if len(h) == 0 {
		return nil
	}
	b, _ := json.Marshal(h) // a map[string]string always encodes
	return string(b)
}

var pgInserts sync.Map // "table/rows" → statement

// pgInsertSQL builds (and caches) an INSERT of rows messages.
func pgInsertSQL(table string, rows int) string {
	key := table + "/" + strconv.Itoa(rows)
	if s, ok := pgInserts.Load(key); ok {
		return s.(string)
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " " + insertColumns + " VALUES ")
	for r := range rows {
		if r > 0 {
			b.WriteByte(',')
		}
		o := r * 7
		fmt.Fprintf(&b, "($%d::uuid,$%d,$%d,$%d::jsonb,$%d,$%d,$%d)", o+1, o+2, o+3, o+4, o+5, o+6, o+7)
	}
	s := b.String()
	pgInserts.Store(key, s)
	return s
}

// maxInsertRows keeps one multi-row INSERT under PostgreSQL's 65535 parameters.
const maxInsertRows = 1000

func (postgres) Insert(ctx context.Context, q Querier, n *Names, msgs []outbox.Message) error {
	for len(msgs) > 0 {
		chunk := msgs[:min(len(msgs), maxInsertRows)]
		msgs = msgs[len(chunk):]
		args := make([]any, 0, 7*len(chunk))
		for _, m := range chunk {
			args = append(args, MessageArgs(m)...)
		}
		if err := q.Exec(ctx, pgInsertSQL(n.Outbox, len(chunk)), args...); err != nil {
			return err
		}
	}
	return nil
}

func (d postgres) Store(db DB, n *Names) outboxdriver.Store {
	return classified(d, db, n, &pgStore{db: db, n: n})
}

type pgStore struct {
	db DB
	n  *Names
}

func (s *pgStore) Stats(ctx context.Context) (outboxdriver.Stats, error) {
	return readStats(ctx, s.db, s.n)
}

func (s *pgStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	loop := pgLoopOf(p.State)
	window, probe, backlog := loop.args(p.Limit)
	// The columns by name: a claim function of an older migration 004 fails as a schema to
	// migrate, not as a scan that does not fit.
	rows, err := s.db.Query(ctx, "SELECT "+claimColumns+", step FROM "+s.n.ClaimFunc+"($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
		p.Owner, p.Token, p.Limit, p.Lease.Milliseconds(), p.Lane, p.Lanes, window, probe, backlog, rand.Float64())
	if err != nil {
		return nil, err
	}
	var (
		step  int16
		steps pgClaimSteps
	)
	claimed, err := scanClaimed(rows, p.Limit, func() { steps.count(step) }, &step)
	if err != nil {
		return nil, err
	}
	loop.learn(p.Limit, steps)
	return claimed, nil
}

// ScanClaimed reads claimed rows (claimColumns; times as times or as text) and returns them
// in outbox order. A row that cannot be read into a valid message does not fail the others:
// it comes back with Claimed.Err naming the column and the problem, for the relay to
// dead-letter alone. limit is how many rows there can be at most (the claim's): the result
// is sized for them at once instead of growing, and copying its large elements, row by row.
func ScanClaimed(rows Rows, limit int) ([]outboxdriver.Claimed, error) {
	return scanClaimed(rows, limit, nil)
}

// scanClaimed is ScanClaimed for rows with more columns after claimColumns: tail are their
// scan targets, and each (if not nil) is called after each row is read into them.
func scanClaimed(rows Rows, limit int, each func(), tail ...any) ([]outboxdriver.Claimed, error) {
	defer rows.Close()
	var (
		out   = make([]outboxdriver.Claimed, 0, min(max(limit, 0), 10000))
		r     outboxRow
		first lenientTime                                   // first_failed_at: a time the relay wrote, or NULL
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
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sortBySeq(out)
	return out, nil
}

func (s *pgStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	return s.db.Exec(ctx, "SELECT "+s.n.CompleteFunc+"($1, string_to_array($2, ',')::bigint[])", token, JoinSeqs(seqs))
}

func (s *pgStore) Retry(ctx context.Context, token int64, retries []outboxdriver.Retry) error {
	js := jsonRetries(retries, pgLimits)
	return s.db.Exec(ctx, s.fence()+`
UPDATE `+s.n.Outbox+` AS o
   SET available_at = now() + r.delay_ms * interval '1 millisecond',
       last_error = r.error,
       first_failed_at = coalesce(o.first_failed_at, now()),
       claim_token = NULL, lease_owner = NULL, lease_until = NULL
  FROM jsonb_to_recordset($2::jsonb) AS r(seq bigint, delay_ms bigint, error text)
 WHERE o.seq = r.seq AND o.claim_token = $1 AND EXISTS (SELECT FROM fence)`, token, string(js))
}

// DeadLetter moves the rows to the dead-letter table in one transaction: the delete returns
// them, and they are inserted made storable (see dlWriter.moveDeadLetters). The rows of dead
// letters with HoldKey are not deleted but held (see hold.go): due never, leased by none,
// where they stand. Under the fence, like Retry: a claim sees the row leased or held,
// never in between.
func (s *pgStore) DeadLetter(ctx context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	if len(dead) == 0 {
		return nil, nil
	}
	hold, drop := holdSplit(dead)
	const failed = `o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type, o.body,
          o.created_at, o.attempts, coalesce(o.first_failed_at, now()), now()`
	return pgDeadLetterWriter(s.n).moveDeadLetters(ctx, s.db, dead, func(ctx context.Context, q Querier) ([]failedRow, error) {
		rows, err := q.Query(ctx, s.fence()+`,
held AS (
UPDATE `+s.n.Outbox+` AS o
   SET available_at = `+heldAt(Postgres)+`, claim_token = NULL, lease_owner = NULL, lease_until = NULL
 WHERE o.claim_token = $1 AND o.seq = ANY (string_to_array($2, ',')::bigint[]) AND o.key <> ''
   AND EXISTS (SELECT FROM fence)
RETURNING `+failed+`, true),
gone AS (
DELETE FROM `+s.n.Outbox+` AS o
 WHERE o.claim_token = $1 AND (o.seq = ANY (string_to_array($3, ',')::bigint[])
                               OR o.seq = ANY (string_to_array($2, ',')::bigint[]) AND o.key = '')
   AND EXISTS (SELECT FROM fence)
RETURNING `+failed+`, false)
SELECT * FROM held UNION ALL SELECT * FROM gone`, token, JoinSeqs(hold), JoinSeqs(drop))
		if err != nil {
			return nil, err
		}
		return scanFailed(rows, true)
	})
}

func (s *pgStore) Release(ctx context.Context, token int64, seqs []int64) error {
	return s.db.Exec(ctx, s.fence()+`
UPDATE `+s.n.Outbox+`
   SET claim_token = NULL, lease_owner = NULL, lease_until = NULL, attempts = attempts - 1
 WHERE claim_token = $1 AND seq = ANY (string_to_array($2, ',')::bigint[]) AND EXISTS (SELECT FROM fence)`, token, JoinSeqs(seqs))
}

// fence starts a write-back that leaves a row in the outbox (Retry, Release) or moves it out
// on failure (DeadLetter) with all the claims' advisory locks in shared mode (the function
// of migration 004): write-backs do not wait for each other, but no claim runs while one is
// in flight. Otherwise a relay whose lease expired could be rescheduling its row X while
// another relay claims: the claim skips the locked X (or sees it change under its lock) and
// takes Y, the next event of X's key, which would then overtake X. The uncorrelated
// EXISTS (SELECT FROM fence) is a one-time filter, so the locks are taken before any row is
// read. Complete needs no fence: a row it deletes was delivered, so a later event of its
// key may go.
func (s *pgStore) fence() string {
	return "WITH fence AS MATERIALIZED (SELECT " + s.n.WriteBacks + "())"
}

// JoinSeqs renders seqs as "1,2,3": one text argument that every driver binds, where array
// arguments are driver-specific.
func JoinSeqs(seqs []int64) string {
	b := make([]byte, 0, 8*len(seqs))
	for i, s := range seqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, s, 10)
	}
	return string(b)
}
