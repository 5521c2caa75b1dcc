package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
)

// MySQL is the MySQL 8.0.13+ / MariaDB 10.6+ dialect (InnoDB; FOR UPDATE SKIP LOCKED,
// JSON_TABLE). The relay store claims at READ COMMITTED when the adapter's DB can (every
// database/sql adapter can); on a server with binlog_format=STATEMENT that level cannot
// write, so use ROW or MIXED (the defaults of MySQL 8 and MariaDB). Its relay store is
// mysql_store.go, its inbox mysql_inbox.go.
var MySQL Dialect = mysqlDialect{mysqlSQL}

type mysqlDialect struct{ *dialectSQL }

func (mysqlDialect) Name() string { return "mysql" }

func (mysqlDialect) Quote(ident string) string { return mysqlQuote(ident) }

func mysqlQuote(ident string) string { return "`" + ident + "`" }

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
		if _, err := scanRow(ctx, q, []any{&got}, "SELECT GET_LOCK(?, ?)", lock, 300); err != nil {
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
	if err := mysqlCheckLens(msgs); err != nil {
		return err
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

// mysqlCheckLens fails for the first message with a field longer than its column.
func mysqlCheckLens(msgs []outbox.Message) error {
	for _, m := range msgs {
		if err := errors.Join(
			checkLen(m, "type", m.Type, mysqlMaxText),
			checkLen(m, "key", m.Key, mysqlMaxText),
			checkLen(m, "content type", m.ContentType, mysqlMaxText),
		); err != nil {
			return err
		}
	}
	return nil
}

func (d mysqlDialect) Store(db DB, n *Names) outboxdriver.Store {
	return classified(d, db, n, newMySQLStore(db, n))
}

func (d mysqlDialect) DeadLetters(db DB, n *Names) deadletter.Table { return newDeadLetters(d, db, n) }

// mysqlSQL is MySQL's part of the SQL every dialect shares (fragments.go).
var mysqlSQL = &dialectSQL{
	now:         mysqlNow,
	rebind:      same,
	key:         "`key`",
	heldAt:      "'9999-12-31 23:59:59.999999'", // the largest DATETIME(6)
	headers:     "COALESCE(CAST(headers AS CHAR), '')",
	eventID:     "COALESCE(event_id, '')",
	epoch:       "'1970-01-01 00:00:00'",
	size:        func(col string) string { return "LENGTH(" + col + ")" },
	uuidParam:   "?",
	jsonParam:   "?",
	bindTime:    func(t time.Time) any { return t.UTC() },
	bindCreated: func(t time.Time) any { return t.UTC() },
	contains:    "LOCATE(?, reason) > 0", // the table's utf8mb4_bin collation compares bytes
	ago: func(d time.Duration) (string, any) {
		return mysqlNow + " - INTERVAL ? MICROSECOND", d.Microseconds()
	},
	lockRows:      " FOR UPDATE",
	skipLocked:    " FOR UPDATE SKIP LOCKED",
	replayHeaders: `JSON_SET(COALESCE(headers, JSON_OBJECT()), '$."` + outbox.ReplayHeader + `"', ?)`,
	bucket: func(col, secs string) string {
		return "TIMESTAMPDIFF(SECOND, '1970-01-01 00:00:00', " + col + ") DIV " + secs + " * " + secs
	},
	tableExists: func(n *Names, name string) (string, []any) {
		var schema any
		if n.Schema != "" {
			schema = n.Schema
		}
		return "SELECT 1 FROM information_schema.tables WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?", []any{schema, name}
	},
	// VARCHAR(255) and TEXT columns; DATETIME holds years 1000 to 9999.
	lim: textLimits{
		chars:   255,
		bytes:   65535,
		minTime: time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC),
		maxTime: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
	},
	dlTuple:    "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
	dlMaxRows:  1000,
	deleteSome: mysqlDeleteSome,
	books: func(n *Names) books {
		b := books{
			table: "CREATE TABLE IF NOT EXISTS " + n.Migrations + " (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB",
			now:   mysqlNow,
		}
		if n.Schema != "" {
			b.schema = "CREATE DATABASE IF NOT EXISTS " + mysqlQuote(n.Schema)
		}
		return b
	},
}

// mysqlDeleteSome deletes up to limit rows of table that match where (with args) and
// returns how many it deleted: MySQL has no DELETE ... RETURNING, so ROW_COUNT() on the
// same connection says.
func mysqlDeleteSome(ctx context.Context, q Querier, table, where string, args []any, limit int) (count int64, err error) {
	err = pinned(ctx, q, func(q Querier) error {
		if err := q.Exec(ctx, "DELETE FROM "+table+" WHERE "+where+" LIMIT ?", append(args, limit)...); err != nil {
			return err
		}
		_, err := scanRow(ctx, q, []any{&count}, "SELECT ROW_COUNT()")
		return err
	})
	return count, err
}

// pinned runs fn on one connection: q itself when it is a transaction, a transaction of
// its own when q is a pool (a DB), so that session functions such as ROW_COUNT() see the
// statement before them.
func pinned(ctx context.Context, q Querier, fn func(Querier) error) error {
	if db, ok := q.(DB); ok {
		return db.InTx(ctx, fn)
	}
	return fn(q)
}
