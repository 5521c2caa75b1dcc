package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/txoutbox/outbox"
)

// MySQL is the MySQL 8.0.13+ / MariaDB 10.6+ dialect (InnoDB; FOR UPDATE SKIP LOCKED,
// JSON_TABLE). The relay store claims at READ COMMITTED when the adapter's DB can (every
// database/sql adapter can); on a server with binlog_format=STATEMENT that level cannot
// write, so use ROW or MIXED (the defaults of MySQL 8 and MariaDB).
var MySQL Dialect = mysqlDialect{}

type mysqlDialect struct{}

func (mysqlDialect) Name() string { return "mysql" }

func (mysqlDialect) Quote(ident string) string { return "`" + ident + "`" }

func (mysqlDialect) Migrations() []Migration { return loadMigrations("mysql") }

// mysqlNow is the database clock: leases and delays are measured by the server, never by
// the relay's host, as PostgreSQL's now() is.
const mysqlNow = "UTC_TIMESTAMP(6)"

// Migrate runs the pending migrations. MySQL commits DDL implicitly, so they cannot share
// one transaction: a session lock (GET_LOCK) keeps concurrent migrators apart, the version
// table records what ran, and every statement is idempotent so a run cut short repeats
// safely. The transaction only pins one connection for the session lock.
func (d mysqlDialect) Migrate(ctx context.Context, db DB, n *Names) error {
	return db.InTx(ctx, func(q Querier) (err error) {
		lock := fmt.Sprintf("txoutbox_migrate_%016x", uint64(n.MigrateKey))
		var got sql.NullInt64
		if err := queryRow(ctx, q, []any{&got}, "SELECT GET_LOCK(?, ?)", lock, 300); err != nil {
			return fmt.Errorf("taking the migration lock: %w", err)
		}
		if got.Int64 != 1 {
			return errors.New("outbox: timed out after 300s waiting for another migration of this outbox (MySQL lock " + lock + ")")
		}
		defer func() {
			if rerr := q.Exec(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", lock); rerr != nil {
				err = errors.Join(err, fmt.Errorf("releasing the migration lock: %w", rerr))
			}
		}()
		return runMigrations(ctx, d, statements{q}, n)
	})
}

func (d mysqlDialect) books(n *Names) books {
	b := books{
		table: "CREATE TABLE IF NOT EXISTS " + n.Migrations + " (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB",
		now:   mysqlNow,
	}
	if n.Schema != "" {
		b.schema = "CREATE DATABASE IF NOT EXISTS " + d.Quote(n.Schema)
	}
	return b
}

// queryRow scans the one row of a query into dest.
func queryRow(ctx context.Context, q Querier, dest []any, query string, args ...any) error {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Err()
}

const (
	mysqlInsertTuple = "(?,?,?,?,?,?,?," + mysqlNow + ")"
	// 1000 rows × 7 parameters stay far under MySQL's 65535; 4 MiB of bodies per statement
	// stays under every server's max_allowed_packet default (MariaDB 16 MiB, MySQL 64 MiB).
	mysqlMaxInsertRows  = 1000
	mysqlMaxInsertBytes = 4 << 20
	mysqlMaxText        = 255 // type, key and content_type are VARCHAR(255)
)

// Insert writes msgs with multi-row INSERTs. Fields longer than their columns fail with an
// error instead of being truncated by a server in non-strict mode.
func (mysqlDialect) Insert(ctx context.Context, q Querier, n *Names, msgs []outbox.Message) error {
	for _, m := range msgs {
		if err := errors.Join(
			checkLen(m, "type", m.Type, mysqlMaxText),
			checkLen(m, "key", m.Key, mysqlMaxText),
			checkLen(m, "content type", m.ContentType, mysqlMaxText),
		); err != nil {
			return err
		}
	}
	head := "INSERT INTO " + n.Outbox + " (id, type, `key`, headers, content_type, body, created_at, available_at) VALUES "
	return insertChunks(msgs, mysqlMaxInsertRows, mysqlMaxInsertBytes, func(chunk []outbox.Message) error {
		args := make([]any, 0, 7*len(chunk))
		for _, m := range chunk {
			args = append(args, messageArgs(m)...)
		}
		return q.Exec(ctx, valuesSQL(head, mysqlInsertTuple, len(chunk)), args...)
	})
}

// messageArgs is MessageArgs with an empty body for a nil one (the column is NOT NULL).
func messageArgs(m outbox.Message) []any {
	if m.Body == nil {
		m.Body = []byte{}
	}
	return MessageArgs(m)
}

func (mysqlDialect) Store(db DB, n *Names) outboxdriver.Store {
	s := &leaseStore{
		db:    db,
		n:     n,
		claim: mysqlClaim,
		now:   mysqlNow,
		held:  heldAt(MySQL),
		key:   "`key`",
		dl:    mysqlConsumer.writer(n),
		// MySQL and MariaDB read the first row of each group of an index as a loose
		// index scan ("Using index for group-by").
		heads: func(upper bool) string {
			op := ">="
			if !upper {
				op = "<"
			}
			return `SELECT o.seq, o.` + "`key`" + `, (o.available_at <= ` + mysqlNow + ` AND (o.lease_until IS NULL OR o.lease_until <= ` + mysqlNow + `))
  FROM (SELECT ` + "`key`" + `, MIN(seq) AS seq FROM ` + n.Outbox + `
         WHERE ` + "`key`" + ` <> '' AND ` + "`key` " + op + ` ?
         GROUP BY ` + "`key`" + ` ORDER BY ` + "`key`" + ` LIMIT ?) AS h
  JOIN ` + n.Outbox + ` AS o ON o.seq = h.seq`
		},
	}
	s.retry = func(token int64, rs []outboxdriver.Retry) (string, []any) {
		args := make([]any, 0, 3*len(rs)+1)
		for _, r := range rs {
			args = append(args, r.Seq, r.Delay.Microseconds(), r.Error)
		}
		return `UPDATE ` + n.Outbox + ` AS o
  JOIN (` + mysqlRowsSQL(len(rs), "seq SIGNED", "delay_us SIGNED", "msg CHAR") + `) AS r
    ON o.seq = r.seq
   SET o.available_at = ` + mysqlNow + ` + INTERVAL r.delay_us MICROSECOND,
       o.last_error = r.msg,
       o.first_failed_at = COALESCE(o.first_failed_at, ` + mysqlNow + `),
       o.claim_token = NULL, o.lease_owner = NULL, o.lease_until = NULL
 WHERE o.claim_token = ?`, append(args, token)
	}
	// MySQL has no DELETE ... RETURNING: the locking read keeps the rows this claim's until
	// the transaction commits.
	s.take = func(ctx context.Context, q Querier, token int64, hold, drop []int64) ([]failedRow, error) {
		rows, err := q.Query(ctx, "SELECT "+s.failedColumns("COALESCE(CAST(headers AS CHAR), '')")+
			" FROM "+n.Outbox+" WHERE claim_token = ? AND "+inSeqs(append(slices.Clone(hold), drop...))+" FOR UPDATE", token)
		if err != nil {
			return nil, err
		}
		taken, err := scanFailed(rows, false)
		if err != nil || len(taken) == 0 {
			return taken, err
		}
		held, gone := splitTaken(taken, hold)
		if len(held) > 0 {
			if err := q.Exec(ctx, s.holdRows(held), token); err != nil {
				return nil, err
			}
		}
		if len(gone) > 0 {
			if err := q.Exec(ctx, "DELETE FROM "+n.Outbox+" WHERE claim_token = ? AND "+inSeqs(gone), token); err != nil {
				return nil, err
			}
		}
		return taken, nil
	}
	return classified(MySQL, db, n, s)
}

// mysqlRowsSQL builds a derived table of rows rows of typed placeholders, "SELECT
// CAST(? AS SIGNED) AS seq, … UNION ALL SELECT …", for write-backs that carry a value per
// row: the optimizer joins it to the outbox's primary key. (One JSON argument read with
// JSON_TABLE would keep the statement constant, but a table function in a multi-table
// UPDATE is not something every MySQL and MariaDB version is known to accept; a derived
// table is.) Each column is "name type" with type SIGNED or CHAR.
func mysqlRowsSQL(rows int, cols ...string) string {
	named := make([]string, len(cols))
	typed := make([]string, len(cols))
	for i, c := range cols {
		name, typ, _ := strings.Cut(c, " ")
		typed[i] = "CAST(? AS " + typ + ")"
		named[i] = typed[i] + " AS " + name
	}
	return repeatSQL("SELECT "+strings.Join(named, ", "), " UNION ALL SELECT "+strings.Join(typed, ", "), "", rows-1)
}

// mysqlClaim is PostgreSQL's claim function as one READ COMMITTED transaction:
//
//  1. an outbox without keyed rows is a plain queue: its oldest free rows, FOR UPDATE SKIP
//     LOCKED, without the claim lock;
//  2. otherwise plan the claim (planClaim) with plain reads; if there is nothing to claim,
//     stop without waiting for the claim lock;
//  3. lock the claim-lock row, so claims of one outbox run one at a time and each sees
//     every lease committed before it (a row lock ends with the transaction, as
//     pg_advisory_xact_lock does; GET_LOCK would outlive the commit unless released by
//     hand on the same connection, and a release lost to a cancelled context would stall
//     every relay), and plan again: claims that held the lock meanwhile are now visible;
//  4. lock the planned rows FOR UPDATE SKIP LOCKED, re-checking that they are free, and
//     keep of each key's run the rows up to the first one missing (keepRuns): write-backs
//     do not take the claim lock here, so a relay whose lease expired may be rescheduling
//     a row of the run;
//  5. stamp the lease on them.
//
// The plans are plain (non-locking) reads: MariaDB extends a statement's FOR UPDATE SKIP
// LOCKED to its subqueries, which would skip a row a write-back holds and let a later row of
// its key overtake it.
func mysqlClaim(ctx context.Context, s *leaseStore, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	var claimed []outboxdriver.Claimed
	err := inTxReadCommitted(ctx, s.db, func(q Querier) error {
		onlyKeyless, err := s.onlyKeyless(ctx, q)
		if err != nil {
			return err
		}
		var (
			plan  []claimCandidate
			from  = s.n.Outbox + " FORCE INDEX (PRIMARY)" // in seq order: cheaper than through (key, seq)
			which = s.oldestKeyless()
			args  = []any{p.Limit}
		)
		if !onlyKeyless {
			if plan, err = s.planClaim(ctx, q, p.Limit); err != nil || len(plan) == 0 {
				return err
			}
			var one int
			if err := queryRow(ctx, q, []any{&one}, "SELECT id FROM "+s.n.ClaimLock+" WHERE id = 1 FOR UPDATE"); err != nil {
				if errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("outbox: %s has no row: run Migrate", s.n.ClaimLock)
				}
				return fmt.Errorf("locking %s: %w", s.n.ClaimLock, err)
			}
			if plan, err = s.planClaim(ctx, q, p.Limit); err != nil || len(plan) == 0 {
				return err
			}
			seqs := make([]int64, len(plan))
			for i, c := range plan {
				seqs[i] = c.seq
			}
			from, which, args = s.n.Outbox, inSeqs(seqs)+" AND "+s.free(""), nil
		}
		rows, err := q.Query(ctx, `SELECT seq, id, type, `+"`key`"+`, COALESCE(CAST(headers AS CHAR), ''),
       content_type, body, created_at, attempts + 1, first_failed_at
  FROM `+from+`
 WHERE `+which+`
   FOR UPDATE SKIP LOCKED`, args...)
		if err != nil {
			return err
		}
		locked, err := ScanClaimed(textTimeRows{rows}, p.Limit)
		if err != nil {
			return err
		}
		keep := make([]int64, 0, len(locked))
		for _, c := range locked {
			keep = append(keep, c.Seq)
		}
		if !onlyKeyless {
			got := make(map[int64]bool, len(locked))
			for _, c := range locked {
				got[c.Seq] = true
			}
			keep, _ = keepRuns(plan, got) // rows locked but not kept are unlocked at commit, untouched
		}
		if len(keep) == 0 {
			return nil
		}
		kept := make(map[int64]bool, len(keep))
		for _, seq := range keep {
			kept[seq] = true
		}
		for _, c := range locked {
			if kept[c.Seq] {
				claimed = append(claimed, c)
			}
		}
		return q.Exec(ctx, `UPDATE `+s.n.Outbox+`
   SET claim_token = ?, lease_owner = ?,
       lease_until = `+mysqlNow+` + INTERVAL ? MICROSECOND,
       attempts = attempts + 1
 WHERE `+inSeqs(keep), p.Token, p.Owner, p.Lease.Microseconds())
	})
	if err != nil {
		return nil, err
	}
	return claimed, nil
}
