package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/txoutbox/outbox"
)

// SQLite is the SQLite 3.35+ dialect, the embedded default: one relay per database file.
//
// SQLite has one writer at a time and no SKIP LOCKED. A claim is a single UPDATE ...
// RETURNING statement: a write statement takes the database's write lock before it reads,
// so its choice of rows and its leases are atomic, and claims are serialised like every
// other write. Several relays on one file are therefore safe but take turns; they gain
// nothing. Open the database with WAL mode and a busy timeout (modernc.org/sqlite:
// "file.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)") so readers never block
// the writer and writers queue instead of failing with SQLITE_BUSY; with
// "_txlock=immediate" application transactions take the write lock at BEGIN as well.
var SQLite Dialect = sqliteDialect{}

type sqliteDialect struct{}

func (sqliteDialect) Name() string { return "sqlite" }

func (sqliteDialect) Quote(ident string) string { return `"` + ident + `"` }

func (sqliteDialect) Migrations() []Migration { return loadMigrations("sqlite") }

// sqliteNow is SQLite's clock as the UTC text every time column holds. 'now' is stable
// within one statement.
const sqliteNow = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

// sqliteTime is the text form of the times Insert writes: UTC, microseconds, like
// PostgreSQL's timestamptz.
const sqliteTime = "2006-01-02 15:04:05.000000"

// Migrate runs the pending migrations in one transaction: SQLite's DDL is transactional.
func (d sqliteDialect) Migrate(ctx context.Context, db DB, n *Names) error {
	return db.InTx(ctx, func(q Querier) error { return runMigrations(ctx, d, statements{q}, n) })
}

// books: a schema is an attached database, which exists already.
func (sqliteDialect) books(n *Names) books {
	return books{
		table: "CREATE TABLE IF NOT EXISTS " + n.Migrations + " (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
		now:   sqliteNow,
	}
}

// sqliteMaxInsertRows keeps 7 parameters a row under the 999 of SQLite builds before 3.32.
const (
	sqliteMaxInsertRows  = 140
	sqliteMaxInsertBytes = 16 << 20
)

func (sqliteDialect) Insert(ctx context.Context, q Querier, n *Names, msgs []outbox.Message) error {
	head := `INSERT INTO ` + n.Outbox + ` (id, type, "key", headers, content_type, body, created_at) VALUES `
	return insertChunks(msgs, sqliteMaxInsertRows, sqliteMaxInsertBytes, func(chunk []outbox.Message) error {
		args := make([]any, 0, 7*len(chunk))
		for _, m := range chunk {
			a := messageArgs(m)
			a[6] = m.CreatedAt.UTC().Format(sqliteTime)
			args = append(args, a...)
		}
		return q.Exec(ctx, valuesSQL(head, "(?,?,?,?,?,?,?)", len(chunk)), args...)
	})
}

func (sqliteDialect) Store(db DB, n *Names) outboxdriver.Store {
	s := &leaseStore{
		db:    db,
		n:     n,
		claim: sqliteClaim,
		now:   sqliteNow,
		held:  heldAt(SQLite),
		key:   `"key"`,
		dl:    sqliteConsumer.writer(n),
		// A recursive query that steps from key to key through the (key, seq) index.
		heads: func(upper bool) string {
			bound := `"key" >= ?1`
			if !upper {
				bound = `"key" < ?1`
			}
			return `WITH RECURSIVE ks(k) AS (
    SELECT (SELECT "key" FROM ` + n.Outbox + ` WHERE ` + bound + ` AND "key" <> '' ORDER BY "key" LIMIT 1)
    UNION ALL
    SELECT (SELECT "key" FROM ` + n.Outbox + ` WHERE "key" > ks.k AND ` + bound + ` AND "key" <> '' ORDER BY "key" LIMIT 1)
      FROM ks WHERE ks.k IS NOT NULL
    LIMIT ?2)
SELECT o.seq, o."key", (o.available_at <= ` + sqliteNow + ` AND (o.lease_until IS NULL OR o.lease_until <= ` + sqliteNow + `))
  FROM ks JOIN ` + n.Outbox + ` AS o
    ON o.seq = (SELECT min(seq) FROM ` + n.Outbox + ` WHERE "key" = ks.k AND "key" <> '')`
		},
	}
	s.retry = func(token int64, rs []outboxdriver.Retry) (string, []any) {
		return `UPDATE ` + n.Outbox + ` AS o
   SET available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', r.delay_ms / 1000.0)),
       last_error = r.msg,
       first_failed_at = COALESCE(o.first_failed_at, ` + sqliteNow + `),
       claim_token = NULL, lease_owner = NULL, lease_until = NULL
  FROM (SELECT json_extract(value, '$.seq') AS seq,
               json_extract(value, '$.delay_ms') AS delay_ms,
               json_extract(value, '$.error') AS msg
          FROM json_each(?)) AS r
 WHERE o.seq = r.seq AND o.claim_token = ?`, []any{jsonRetries(rs, sqliteLimits), token}
	}
	// UPDATE or DELETE ... RETURNING takes the write lock first, so the rows read are the
	// rows held or deleted.
	s.take = func(ctx context.Context, q Querier, token int64, hold, drop []int64) ([]failedRow, error) {
		returning := " RETURNING " + s.failedColumns("COALESCE(headers, '')")
		var taken []failedRow
		if len(hold) > 0 {
			rows, err := q.Query(ctx, s.holdRows(hold)+returning, token)
			if err != nil {
				return nil, err
			}
			if taken, err = scanFailed(rows, false); err != nil {
				return nil, err
			}
			for i := range taken {
				taken[i].held = true
			}
		}
		// The keyless rows of hold are not held: deleted, as the others.
		rows, err := q.Query(ctx, "DELETE FROM "+n.Outbox+" WHERE claim_token = ? AND ("+inSeqs(drop)+
			" OR "+s.key+" = '' AND "+inSeqs(hold)+")"+returning, token)
		if err != nil {
			return nil, err
		}
		gone, err := scanFailed(rows, false)
		return append(taken, gone...), err
	}
	return classified(SQLite, db, n, s)
}

// sqliteClaim leases with one UPDATE ... RETURNING (atomic: a write statement takes the
// database's write lock before it reads). An outbox without keyed rows is a plain queue: the
// oldest free rows. Otherwise the claim is planned (planClaim) with plain reads, and the
// planned rows still free are leased; a planned row that is gone or no longer free (another
// relay claimed it since the plan, or a write-back changed it) ends its key's run, and the
// rows leased after it are given back at once (keepRuns).
func sqliteClaim(ctx context.Context, s *leaseStore, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	onlyKeyless, err := s.onlyKeyless(ctx, s.db)
	if err != nil {
		return nil, err
	}
	var (
		plan  []claimCandidate
		which = "seq IN (SELECT seq FROM " + s.n.Outbox + " WHERE " + s.oldestKeyless() + ")"
		args  = []any{p.Limit}
	)
	if !onlyKeyless {
		if plan, err = s.planClaim(ctx, s.db, p.Limit); err != nil || len(plan) == 0 {
			return nil, err
		}
		seqs := make([]int64, len(plan))
		for i, c := range plan {
			seqs[i] = c.seq
		}
		which, args = inSeqs(seqs), nil
	}
	rows, err := s.db.Query(ctx, `UPDATE `+s.n.Outbox+`
   SET claim_token = ?, lease_owner = ?,
       lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', ?),
       attempts = attempts + 1
 WHERE `+which+` AND `+s.free("")+`
RETURNING seq, id, type, "key", COALESCE(headers, ''), content_type, body, created_at, attempts, first_failed_at`,
		append([]any{p.Token, p.Owner, fmt.Sprintf("%+.3f seconds", p.Lease.Seconds())}, args...)...)
	if err != nil {
		return nil, err
	}
	leased, err := ScanClaimed(textTimeRows{rows}, p.Limit)
	if err != nil || onlyKeyless {
		return leased, err
	}
	got := make(map[int64]bool, len(leased))
	for _, c := range leased {
		got[c.Seq] = true
	}
	keep, giveBack := keepRuns(plan, got)
	if len(giveBack) == 0 {
		return leased, nil
	}
	if err := s.Release(ctx, p.Token, giveBack); err != nil {
		return nil, fmt.Errorf("giving back rows behind a run that changed: %w", err)
	}
	kept := make(map[int64]bool, len(keep))
	for _, seq := range keep {
		kept[seq] = true
	}
	return slices.DeleteFunc(leased, func(c outboxdriver.Claimed) bool { return !kept[c.Seq] }), nil
}

// jsonRetries encodes a Retry write-back for dialects that read per-row values from one
// JSON argument (PostgreSQL's jsonb_to_recordset, SQLite's json_each), each error made
// storable under lim (a broker's error text may hold anything).
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
