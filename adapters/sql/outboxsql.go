// Package outboxsql stores txoutbox events through database/sql, for applications on sqlx,
// sqlc, ent or plain *sql.Tx: Publish writes events in the caller's transaction, NewStore
// gives the relay its leased claims over a *sql.DB, and Idempotent runs a consumer's handler
// in a transaction that also records the event in the inbox. It is for application
// developers on database/sql.
//
// Every verb goes through an [Outbox]. database/sql cannot tell which database a driver
// speaks, so an Outbox carries its dialect, and the outboxes at the default table names
// are one per dialect: [Postgres] (pgx's stdlib driver, lib/pq, bun's pgdriver…), [MySQL]
// (MySQL 8.0.13+ or MariaDB 10.6+ through github.com/go-sql-driver/mysql) or [SQLite]
// (SQLite 3.35+, e.g. modernc.org/sqlite, which needs no cgo). [New] makes one at other
// names.
//
//	err := outboxsql.Postgres.Publish(ctx, tx, outbox.New(OrderPlaced{ID: id}))
//	billing, err := outboxsql.New(outboxsql.Postgres, outbox.Tables{Schema: "billing"})
//	h := outboxsql.Idempotent(billing, db, handle, nil)
//
// outboxpgx, outboxgorm and outboxbun have the same verbs, with the same names, arguments
// (each library's own handles) and results; where they have Default, this package has one
// outbox per dialect. Each dialect's SQL is the one the other adapters use, so any adapter's
// relay delivers events written through this one.
package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Outbox is an outbox of one dialect at one set of table names, and every verb of this package
// goes through one: [Postgres], [MySQL] and [SQLite] are the outboxes at the default names,
// [New] makes one at others. The verbs that are generic over the event type ([Idempotent],
// [SkipSeen]) are functions that take the Outbox first, since Go methods cannot have type
// parameters; the others are its methods. An Outbox is immutable and safe for concurrent use.
type Outbox struct {
	d     sqlstore.Dialect
	names *sqlstore.Names
}

// The outboxes at the default table names, one per dialect: "outbox",
// "outbox_dead_letters", "outbox_inbox"… in the connection's default schema (PostgreSQL's
// search_path, MySQL's database, SQLite's main database).
var (
	// Postgres is the outbox at the default names on PostgreSQL 12 and later.
	Postgres = mustNew(sqlstore.Postgres)
	// MySQL is the outbox at the default names on MySQL 8.0.13+ and MariaDB 10.6+ (InnoDB).
	// With go-sql-driver/mysql, keep the DSN's loc at UTC (the default): the tables hold UTC
	// times. parseTime=true is usual but not needed, and so is multiStatements. The relay's
	// claims run at READ COMMITTED, which needs binlog_format ROW or MIXED (the defaults).
	MySQL = mustNew(sqlstore.MySQL)
	// SQLite is the outbox at the default names on SQLite 3.35 and later, for one relay per
	// database file. Open the database with WAL mode and a busy timeout, e.g. with
	// modernc.org/sqlite "file.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)", so
	// that producers and the relay queue for SQLite's single writer instead of failing with
	// SQLITE_BUSY. Use a database file: each pooled connection to ":memory:" is a database
	// of its own.
	SQLite = mustNew(sqlstore.SQLite)
)

// New validates t and returns the outbox at those names in the dialect of d: [Postgres],
// [MySQL] or [SQLite] (or any outbox made from one of them).
func New(d *Outbox, t outbox.Tables) (*Outbox, error) {
	if d == nil {
		return nil, errors.New("outboxsql: New needs a dialect (outboxsql.Postgres, MySQL or SQLite), got nil")
	}
	n, err := sqlstore.NewNames(d.d, t)
	if err != nil {
		return nil, err
	}
	return &Outbox{d: d.d, names: n}, nil
}

func mustNew(d sqlstore.Dialect) *Outbox {
	return &Outbox{d: d, names: sqlstore.MustOutbox(sqlstore.NewNames(d, outbox.Tables{}))}
}

// Tx is what Publish writes through: a *sql.Tx, or a wrapper with the same methods
// (*sqlx.Tx, an ent transaction built with the sql/execquery feature). A *sql.DB does not
// qualify: the events must commit with the caller's changes.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	Commit() error
	Rollback() error
}

// Publish writes events inside tx; they become visible to the relay when tx commits and
// vanish if it rolls back. An event that cannot be encoded fails the call before anything
// is written, so the caller can roll back; so does an event that breaks the rules of
// [outbox.Message] (outbox.ErrInvalidEvent). A nil tx, typed or not, fails with
// outbox.ErrNotInTransaction. Up to 1000 events cost one statement.
func (o *Outbox) Publish(ctx context.Context, tx Tx, events ...outbox.Encodable) error {
	if outboxdriver.IsNil(tx) {
		return fmt.Errorf("outboxsql: %w: got a nil %T", outbox.ErrNotInTransaction, tx)
	}
	if err := sqlstore.Publish(ctx, o.d, sqlstore.StdQuerier(tx), o.names, events); err != nil {
		return fmt.Errorf("outboxsql: %w", err)
	}
	return nil
}

// Cancel takes back the scheduled event id (published with outbox.WithDeliverAt or
// WithDelay) inside tx, and reports whether it was still scheduled. Once tx commits, the event
// is never delivered; if tx rolls back, it stays scheduled. false means it was not waiting
// any more: it fell due and the relay moved it into the outbox (it is being or was
// delivered), it was cancelled before, or it was never scheduled. See docs/scheduled.md.
func (o *Outbox) Cancel(ctx context.Context, tx Tx, id uuid.UUID) (bool, error) {
	if outboxdriver.IsNil(tx) {
		return false, fmt.Errorf("outboxsql: %w: got a nil %T", outbox.ErrNotInTransaction, tx)
	}
	ok, err := sqlstore.Cancel(ctx, o.d, sqlstore.StdQuerier(tx), o.names, id)
	if err != nil {
		return false, fmt.Errorf("outboxsql: %w", err)
	}
	return ok, nil
}

// Migrate creates or upgrades the outbox's tables; concurrent callers wait for each other,
// and it is safe to call at every start. PostgreSQL and SQLite migrate in one transaction.
// MySQL commits DDL as it goes, so there a lock keeps migrators apart and every step is
// idempotent: an interrupted migration completes at the next call.
func (o *Outbox) Migrate(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return errors.New("outboxsql: Migrate needs a *sql.DB, got nil")
	}
	if err := o.d.Migrate(ctx, sqlstore.StdDB(db), o.names); err != nil {
		return fmt.Errorf("outboxsql: migrating %s (%s): %w", o.names.Outbox, o.d.Name(), err)
	}
	return nil
}

// MigrateTx is Migrate inside the caller's transaction, for applications that run their
// own migrations in one transaction (PostgreSQL, SQLite). On MySQL it fails without doing
// anything: DDL would commit the caller's transaction.
func (o *Outbox) MigrateTx(ctx context.Context, tx *sql.Tx) error {
	if tx == nil {
		return fmt.Errorf("outboxsql: %w: MigrateTx got a nil *sql.Tx", outbox.ErrNotInTransaction)
	}
	if o.d == sqlstore.MySQL {
		return errors.New("outboxsql: MigrateTx is not possible on MySQL, whose DDL commits the transaction; use Migrate")
	}
	if err := o.d.Migrate(ctx, sqlstore.StdTxDB(tx), o.names); err != nil {
		return fmt.Errorf("outboxsql: migrating %s (%s): %w", o.names.Outbox, o.d.Name(), err)
	}
	return nil
}

// Validate checks, changing nothing, that o's tables are those this version expects: every
// migration applied, none unknown to it, every column the library reads and writes there.
// Call it at start when the schema is migrated by another tool (the SQL of
// "outbox migrate --script"). The error wraps [outbox.ErrSchema] and names every problem.
func (o *Outbox) Validate(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return errors.New("outboxsql: Validate needs a *sql.DB, got nil")
	}
	if err := sqlstore.Validate(ctx, o.d, sqlstore.StdQuerier(db), o.names); err != nil {
		return fmt.Errorf("outboxsql: %w", err)
	}
	return nil
}

// NewStore returns the relay's store for this outbox over db.
func (o *Outbox) NewStore(db *sql.DB) (outboxdriver.Store, error) {
	if db == nil {
		return nil, errors.New("outboxsql: NewStore needs a *sql.DB, got nil")
	}
	return o.d.Store(sqlstore.StdDB(db), o.names), nil
}
