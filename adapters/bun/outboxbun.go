// Package outboxbun stores txoutbox events through bun: Publish writes them in the caller's
// bun.Tx (db.RunInTx or BeginTx), on the transaction's own connection, with no second
// connection and no extra commit; NewStore gives the relay its leased claims over a *bun.DB;
// and Idempotent runs a consumer's handler in a bun transaction that also records the event
// in the inbox. It is for application developers on bun.
//
// Every verb goes through an [Outbox]: [Default] for the default table names, or one from
// [New] for others.
//
//	err := outboxbun.Default.Publish(ctx, tx, outbox.New(OrderPlaced{ID: id}))
//	billing, err := outboxbun.New(outbox.Tables{Schema: "billing"})
//	h := outboxbun.Idempotent(billing, db, handle, nil)
//
// outboxpgx, outboxgorm and outboxsql have the same verbs, with the same names, arguments
// (each library's own handles) and results.
//
// The dialect follows bun's: pgdialect (on pgdriver, pgx's stdlib driver or another
// PostgreSQL driver), mysqldialect (MySQL 8.0.13+ or MariaDB 10.6+; keep the DSN's loc at
// UTC, the default) or sqlitedialect (SQLite 3.35+, opened in WAL mode with a busy
// timeout). The SQL is the one every txoutbox adapter shares, so events written here
// can be relayed by any of them.
//
// Publish runs its SQL on the transaction's *sql.Tx, past bun's query formatting and query
// hooks: the outbox is not a bun model.
package outboxbun

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Outbox is an outbox at one set of table names, and every verb of this package goes through
// one: [Default] is the outbox at the default names, [New] makes one at others. The verbs that
// are generic over the event type ([Idempotent], [SkipSeen]) are functions that take the Outbox
// first, since Go methods cannot have type parameters; the others are its methods. An Outbox is
// immutable and safe for concurrent use; it serves every dialect, which each call takes from
// its bun handle.
type Outbox struct {
	names     map[string]*sqlstore.Names
	allowNoTx bool
}

// Default is the outbox at the default table names: "outbox", "outbox_dead_letters",
// "outbox_inbox"… in the connection's default schema (PostgreSQL's search_path, MySQL's
// database, SQLite's main database). Its Publish insists on a transaction.
var Default = sqlstore.MustOutbox(New(outbox.Tables{}))

// Option configures an [Outbox].
type Option func(*Outbox)

// AllowNoTx lets Publish write through a *bun.DB or bun.Conn that is not in a transaction:
// each call then commits on its own, whatever happens to the caller's other writes. Use it
// only where that is the point (a job that publishes and changes nothing else); without it
// such a call fails with [outbox.ErrNotInTransaction].
func AllowNoTx() Option { return func(o *Outbox) { o.allowNoTx = true } }

// New validates t and returns the outbox at those names.
func New(t outbox.Tables, opts ...Option) (*Outbox, error) {
	names, err := sqlstore.NamesByDialect(t)
	if err != nil {
		return nil, err
	}
	o := &Outbox{names: names}
	for _, opt := range opts {
		opt(o)
	}
	return o, nil
}

// Publish writes events inside tx, which must be a bun.Tx (the tx of db.RunInTx, or of
// BeginTx; a nested transaction's savepoint works too). The events become visible to the
// relay when the transaction commits and vanish if it rolls back. An event that cannot be
// encoded, or that breaks the rules of [outbox.Message] (outbox.ErrInvalidEvent), fails the
// call before anything is written. A nil or zero tx fails with
// [outbox.ErrNotInTransaction], and so does a *bun.DB or bun.Conn unless the outbox was
// built with [AllowNoTx]. Up to 1000 events cost one statement.
func (o *Outbox) Publish(ctx context.Context, tx bun.IDB, events ...outbox.Encodable) error {
	q, err := o.executor(tx)
	if err != nil {
		return err
	}
	d, n, err := o.dialect(tx)
	if err != nil {
		return err
	}
	if err := sqlstore.Publish(ctx, d, sqlstore.StdQuerier(q), n, events); err != nil {
		return fmt.Errorf("outboxbun: %w", err)
	}
	return nil
}

// Cancel takes back the scheduled event id (published with outbox.WithDeliverAt or
// WithDelay) inside tx (a bun.Tx; with AllowNoTx, also a *bun.DB or bun.Conn), and reports whether it was still scheduled. Once tx commits, the event
// is never delivered; if tx rolls back, it stays scheduled. false means it was not waiting
// any more: it fell due and the relay moved it into the outbox (it is being or was
// delivered), it was cancelled before, or it was never scheduled. See docs/scheduled.md.
func (o *Outbox) Cancel(ctx context.Context, tx bun.IDB, id uuid.UUID) (bool, error) {
	q, err := o.executor(tx)
	if err != nil {
		return false, err
	}
	d, n, err := o.dialect(tx)
	if err != nil {
		return false, err
	}
	ok, err := sqlstore.Cancel(ctx, d, sqlstore.StdQuerier(q), n, id)
	if err != nil {
		return false, fmt.Errorf("outboxbun: %w", err)
	}
	return ok, nil
}

// executor returns the database/sql value under db: the *sql.Tx of a bun.Tx, or (with
// AllowNoTx) the pool or connection.
func (o *Outbox) executor(db bun.IDB) (sqlstore.StdExecer, error) {
	notInTx := func(what string) error {
		return fmt.Errorf("outboxbun: %w: got %s, not a bun.Tx (build the Outbox with AllowNoTx to publish outside a transaction)", outbox.ErrNotInTransaction, what)
	}
	switch v := db.(type) {
	case bun.Tx:
		if v.Tx != nil {
			return v.Tx, nil
		}
	case *bun.Tx:
		if v != nil && v.Tx != nil {
			return v.Tx, nil
		}
	case *bun.DB:
		if v == nil {
			break
		}
		if !o.allowNoTx {
			return nil, notInTx("a *bun.DB")
		}
		return v.DB, nil
	case bun.Conn:
		if v.Conn == nil {
			break
		}
		if !o.allowNoTx {
			return nil, notInTx("a bun.Conn")
		}
		return v.Conn, nil
	default:
		if db != nil {
			return nil, fmt.Errorf("outboxbun: unsupported bun.IDB %T (want a bun.Tx)", db)
		}
	}
	return nil, fmt.Errorf("outboxbun: %w: got a nil or zero bun.IDB", outbox.ErrNotInTransaction)
}

// Migrate creates or upgrades the outbox's tables; concurrent callers wait for each other,
// and it is safe to call at every start. PostgreSQL and SQLite migrate in one transaction.
// MySQL commits DDL as it goes, so there a lock keeps migrators apart and every step is
// idempotent: an interrupted migration completes at the next call.
func (o *Outbox) Migrate(ctx context.Context, db *bun.DB) error {
	d, n, err := o.dialect(db)
	if err != nil {
		return err
	}
	if err := d.Migrate(ctx, sqlstore.StdDB(db.DB), n); err != nil {
		return fmt.Errorf("outboxbun: migrating %s (%s): %w", n.Outbox, d.Name(), err)
	}
	return nil
}

// MigrateTx is Migrate inside the caller's transaction, for applications that run their
// own migrations in one transaction (PostgreSQL, SQLite). On MySQL it fails without doing
// anything: DDL would commit the caller's transaction.
func (o *Outbox) MigrateTx(ctx context.Context, tx bun.Tx) error {
	if tx.Tx == nil {
		return fmt.Errorf("outboxbun: %w: MigrateTx got a zero bun.Tx", outbox.ErrNotInTransaction)
	}
	d, n, err := o.dialect(tx)
	if err != nil {
		return err
	}
	if d == sqlstore.MySQL {
		return errors.New("outboxbun: MigrateTx is not possible on MySQL, whose DDL commits the transaction; use Migrate")
	}
	if err := d.Migrate(ctx, sqlstore.StdTxDB(tx.Tx), n); err != nil {
		return fmt.Errorf("outboxbun: migrating %s (%s): %w", n.Outbox, d.Name(), err)
	}
	return nil
}

// Validate checks, changing nothing, that o's tables are those this version expects: every
// migration applied, none unknown to it, every column the library reads and writes there.
// Call it at start when the schema is migrated by another tool (the SQL of
// "outbox migrate --script"). The error wraps [outbox.ErrSchema] and names every problem.
func (o *Outbox) Validate(ctx context.Context, db *bun.DB) error {
	d, n, err := o.dialect(db)
	if err != nil {
		return err
	}
	if err := sqlstore.Validate(ctx, d, sqlstore.StdQuerier(db.DB), n); err != nil {
		return fmt.Errorf("outboxbun: %w", err)
	}
	return nil
}

// NewStore returns the relay's store for this outbox over db's connection pool.
func (o *Outbox) NewStore(db *bun.DB) (outboxdriver.Store, error) {
	d, n, err := o.dialect(db)
	if err != nil {
		return nil, err
	}
	return d.Store(sqlstore.StdDB(db.DB), n), nil
}

// dialect maps db's bun dialect to the SQL dialect and this outbox's names in it.
func (o *Outbox) dialect(db bun.IDB) (sqlstore.Dialect, *sqlstore.Names, error) {
	var name dialect.Name
	switch v := db.(type) {
	case nil:
		return nil, nil, errors.New("outboxbun: got a nil bun.IDB")
	case *bun.DB:
		if v == nil {
			return nil, nil, errors.New("outboxbun: got a nil *bun.DB")
		}
	}
	if d := db.Dialect(); d != nil {
		name = d.Name()
	}
	var d sqlstore.Dialect
	switch name {
	case dialect.PG:
		d = sqlstore.Postgres
	case dialect.MySQL:
		d = sqlstore.MySQL
	case dialect.SQLite:
		d = sqlstore.SQLite
	default:
		return nil, nil, fmt.Errorf("outboxbun: bun dialect %q is not supported (pgdialect, mysqldialect, sqlitedialect)", name)
	}
	return d, o.names[d.Name()], nil
}
