// Package outboxsql stores txoutbox events through database/sql, for applications on sqlx,
// sqlc, ent or plain *sql.Tx: Publish writes events in the caller's transaction, and
// NewStore gives the relay its leased claims over a *sql.DB.
//
// database/sql cannot tell which database a driver speaks, so the dialect is given
// explicitly: [Postgres] (pgx's stdlib driver, lib/pq, bun's pgdriver…), [MySQL] (MySQL
// 8.0.13+ or MariaDB 10.6+ through github.com/go-sql-driver/mysql) or [SQLite] (SQLite
// 3.35+, e.g. modernc.org/sqlite, which needs no cgo). The package-level functions are the
// other adapters' with the dialect before the database handle —
// outboxsql.Publish(ctx, outboxsql.Postgres, tx, events...) — and an [Outbox] from [New]
// carries its dialect, so its methods are exactly the other adapters'. Each dialect's SQL is
// the one the other adapters use, so any adapter's relay delivers events written through
// this one.
//
// On the consumer side, Idempotent runs a handler in a transaction that also records the
// event in the inbox (IdempotentGrouped groups events into shared transactions, SkipSeen
// skips duplicates of effects outside the database), IdempotentHTTP makes a POST handler
// idempotent per Idempotency-Key, and NewDeadLetters opens the dead-letter table.
package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// Dialect is the SQL dialect of a database: [Postgres], [MySQL] or [SQLite].
type Dialect struct{ d sqlstore.Dialect }

// String returns the dialect's name: "postgres", "mysql" or "sqlite".
func (d Dialect) String() string {
	if d.d == nil {
		return "none"
	}
	return d.d.Name()
}

var (
	// Postgres is PostgreSQL 12 and later.
	Postgres = Dialect{sqlstore.Postgres}
	// MySQL is MySQL 8.0.13+ and MariaDB 10.6+ (InnoDB). With go-sql-driver/mysql, keep
	// the DSN's loc at UTC (the default): the tables hold UTC times. parseTime=true is
	// usual but not needed, and so is multiStatements. The relay's claims run at READ
	// COMMITTED, which needs binlog_format ROW or MIXED (the defaults).
	MySQL = Dialect{sqlstore.MySQL}
	// SQLite is SQLite 3.35 and later, for one relay per database file. Open the database
	// with WAL mode and a busy timeout, e.g. with modernc.org/sqlite
	// "file.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)", so that producers and
	// the relay queue for SQLite's single writer instead of failing with SQLITE_BUSY. Use a
	// database file: each pooled connection to ":memory:" is a database of its own.
	SQLite = Dialect{sqlstore.SQLite}
)

// Tx is what Publish writes through: a *sql.Tx, or a wrapper with the same methods
// (*sqlx.Tx, an ent transaction built with the sql/execquery feature). A *sql.DB does not
// qualify: the events must commit with the caller's changes.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	Commit() error
	Rollback() error
}

// Outbox is an outbox of one dialect at configured table names. The package-level functions
// use the default names (table "outbox" in the connection's default schema) of the dialect
// they are given.
type Outbox struct {
	d     sqlstore.Dialect
	names *sqlstore.Names
}

// New validates t and returns an outbox of dialect d at those names. The zero Tables are
// the table "outbox" in the connection's default schema (PostgreSQL's search_path, MySQL's
// database, SQLite's main database).
func New(d Dialect, t outbox.Tables) (*Outbox, error) {
	if d.d == nil {
		return nil, errors.New("outboxsql: New needs a dialect (outboxsql.Postgres, MySQL or SQLite)")
	}
	n, err := sqlstore.NewNames(d.d, t)
	if err != nil {
		return nil, err
	}
	return &Outbox{d: d.d, names: n}, nil
}

// Dialect returns the outbox's dialect.
func (o *Outbox) Dialect() Dialect { return Dialect{o.d} }

// defaults are the outboxes at the default names, by dialect name.
var defaults = func() map[string]*Outbox {
	out := map[string]*Outbox{}
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		o, err := New(d, outbox.Tables{})
		if err != nil {
			panic(err)
		}
		out[d.String()] = o
	}
	return out
}()

// defaultOutbox returns d's outbox at the default names.
func defaultOutbox(d Dialect) (*Outbox, error) {
	if d.d == nil {
		return nil, errors.New("outboxsql: no dialect given (outboxsql.Postgres, MySQL or SQLite)")
	}
	return defaults[d.String()], nil
}

// Publish writes events to dialect d's default outbox inside tx. See [Outbox.Publish].
func Publish(ctx context.Context, d Dialect, tx Tx, events ...outbox.Encodable) error {
	o, err := defaultOutbox(d)
	if err != nil {
		return err
	}
	return o.Publish(ctx, tx, events...)
}

// Migrate creates or upgrades dialect d's default outbox tables. See [Outbox.Migrate].
func Migrate(ctx context.Context, d Dialect, db *sql.DB) error {
	o, err := defaultOutbox(d)
	if err != nil {
		return err
	}
	return o.Migrate(ctx, db)
}

// MigrateTx creates or upgrades dialect d's default outbox tables inside tx. See
// [Outbox.MigrateTx].
func MigrateTx(ctx context.Context, d Dialect, tx *sql.Tx) error {
	o, err := defaultOutbox(d)
	if err != nil {
		return err
	}
	return o.MigrateTx(ctx, tx)
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

// Validate checks dialect d's default outbox. See [Outbox.Validate].
func Validate(ctx context.Context, d Dialect, db *sql.DB) error {
	o, err := defaultOutbox(d)
	if err != nil {
		return err
	}
	return o.Validate(ctx, db)
}

// NewStore returns the relay store of dialect d's default outbox. See [Outbox.NewStore].
func NewStore(d Dialect, db *sql.DB) (outboxdriver.Store, error) {
	o, err := defaultOutbox(d)
	if err != nil {
		return nil, err
	}
	return o.NewStore(db)
}

// Publish writes events inside tx; they become visible to the relay when tx commits and
// vanish if it rolls back. An event that cannot be encoded fails the call before anything
// is written, so the caller can roll back; so does an event that breaks the rules of
// [outbox.Message] (outbox.ErrInvalidEvent). A nil tx, typed or not, fails with
// outbox.ErrNotInTransaction. Up to 1000 events cost one statement.
func (o *Outbox) Publish(ctx context.Context, tx Tx, events ...outbox.Encodable) error {
	if sqlstore.IsNil(tx) {
		return fmt.Errorf("outboxsql: %w: got a nil %T", outbox.ErrNotInTransaction, tx)
	}
	if err := sqlstore.Publish(ctx, o.d, sqlstore.StdQuerier(tx), o.names, events); err != nil {
		return fmt.Errorf("outboxsql: %w", err)
	}
	return nil
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

// NewStore returns the relay's store for this outbox over db.
func (o *Outbox) NewStore(db *sql.DB) (outboxdriver.Store, error) {
	if db == nil {
		return nil, errors.New("outboxsql: NewStore needs a *sql.DB, got nil")
	}
	return o.d.Store(sqlstore.StdDB(db), o.names), nil
}
