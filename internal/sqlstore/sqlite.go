package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
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
// "_txlock=immediate" application transactions take the write lock at BEGIN as well. Its
// relay store is sqlite_store.go, its inbox sqlite_inbox.go.
var SQLite Dialect = sqliteDialect{sqliteSQL}

type sqliteDialect struct{ *dialectSQL }

func (sqliteDialect) Name() string { return "sqlite" }

func (sqliteDialect) Quote(ident string) string { return sqliteQuote(ident) }

func sqliteQuote(ident string) string { return `"` + ident + `"` }

func (sqliteDialect) Migrations() []Migration { return loadMigrations("sqlite") }

// sqliteNow is SQLite's clock as the UTC text every time column holds. 'now' is stable
// within one statement.
const sqliteNow = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

// sqliteTime is the text form of the times Insert writes: UTC, microseconds, like
// PostgreSQL's timestamptz. sqliteClockTime is that of SQLite's clock (strftime's %f has
// milliseconds).
const (
	sqliteTime      = "2006-01-02 15:04:05.000000"
	sqliteClockTime = "2006-01-02 15:04:05.000"
)

// Migrate runs the pending migrations in one transaction: SQLite's DDL is transactional.
func (d sqliteDialect) Migrate(ctx context.Context, db DB, n *Names) error {
	return db.InTx(ctx, func(q Querier) error { return runMigrations(ctx, d, statements{q}, n) })
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

func (d sqliteDialect) Store(db DB, n *Names) outboxdriver.Store {
	return classified(d, db, n, newSQLiteStore(db, n))
}

func (d sqliteDialect) DeadLetters(db DB, n *Names) deadletter.Table { return newDeadLetters(d, db, n) }

// sqliteSQL is SQLite's part of the SQL every dialect shares (fragments.go).
var sqliteSQL = &dialectSQL{
	now:         sqliteNow,
	rebind:      same,
	key:         `"key"`,
	heldAt:      "'9999-12-31 23:59:59.999'", // later than any time its clock writes
	headers:     "COALESCE(headers, '')",
	eventID:     "COALESCE(event_id, '')",
	epoch:       "'1970-01-01 00:00:00'",
	size:        func(col string) string { return "length(CAST(" + col + " AS BLOB))" }, // bytes, also of a value written as text
	uuidParam:   "?",
	jsonParam:   "?",
	bindTime:    func(t time.Time) any { return t.UTC().Format(sqliteClockTime) },
	bindCreated: func(t time.Time) any { return t.UTC().Format(sqliteTime) },
	contains:    "instr(reason, ?) > 0",
	ago: func(d time.Duration) (string, any) {
		return "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)", fmt.Sprintf("%+.3f seconds", -d.Seconds())
	},
	lockRows:      "", // a write transaction holds the whole database
	skipLocked:    "", // a write transaction holds the whole database
	replayHeaders: `json_set(COALESCE(headers, '{}'), '$."` + outbox.ReplayHeader + `"', ?)`,
	bucket: func(col, secs string) string {
		return "CAST(strftime('%s', " + col + ") AS INTEGER) / " + secs + " * " + secs
	},
	tableExists: func(n *Names, name string) (string, []any) {
		master := "sqlite_master"
		if n.Schema != "" {
			master = sqliteQuote(n.Schema) + ".sqlite_master"
		}
		return "SELECT 1 FROM " + master + " WHERE type = 'table' AND name = ?", []any{name}
	},
	dlTuple:    "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
	dlMaxRows:  999 / dlColumnCount, // the parameter limit of builds before 3.32
	deleteSome: sqliteDeleteSome,
	// A schema is an attached database, which exists already.
	books: func(n *Names) books {
		return books{
			table: "CREATE TABLE IF NOT EXISTS " + n.Migrations + " (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
			now:   sqliteNow,
		}
	},
}

// sqliteDeleteSome deletes up to limit rows of table that match where (with args) and
// returns how many it deleted.
func sqliteDeleteSome(ctx context.Context, q Querier, table, where string, args []any, limit int) (int64, error) {
	rows, err := q.Query(ctx, "DELETE FROM "+table+" WHERE rowid IN (SELECT rowid FROM "+table+
		" WHERE "+where+" LIMIT ?) RETURNING 1", append(args, limit)...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var count int64
	for rows.Next() {
		count++
	}
	return count, rows.Err()
}
