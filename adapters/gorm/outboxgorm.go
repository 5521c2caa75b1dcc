// Package outboxgorm stores txoutbox events through GORM: Publish writes them in the
// caller's GORM transaction (db.Transaction or Begin), on the transaction's own connection,
// with no second connection and no extra commit; NewStore gives the relay its leased claims
// over the *gorm.DB's pool; and Idempotent runs a consumer's handler in a GORM transaction
// that also records the event in the inbox. It is for application developers on GORM.
//
// Every verb goes through an [Outbox]: [Default] for the default table names, or one from
// [New] for others.
//
//	err := outboxgorm.Default.Publish(ctx, tx, outbox.New(OrderPlaced{ID: id}))
//	billing, err := outboxgorm.New(outbox.Tables{Schema: "billing"})
//	h := outboxgorm.Idempotent(billing, db, handle, nil)
//
// outboxpgx, outboxbun and outboxsql have the same verbs, with the same names, arguments
// (each library's own handles) and results. The context is the first argument here too;
// the *gorm.DB's own (db.WithContext) is not consulted.
//
// The dialect follows the GORM dialector: "postgres" (gorm.io/driver/postgres, whichever
// database/sql driver it runs on), "mysql" (gorm.io/driver/mysql; MySQL 8.0.13+ or MariaDB
// 10.6+; keep the DSN's loc at UTC, the default) or "sqlite" (a pure-Go driver such as
// github.com/glebarez/sqlite, or gorm.io/driver/sqlite; SQLite 3.35+, opened in WAL mode
// with a busy timeout). The SQL is the one every txoutbox adapter shares, so
// events written here can be relayed by any of them.
//
// Publish sends its SQL straight to the transaction's connection, past GORM's callbacks,
// hooks and logger: the outbox is not a GORM model.
package outboxgorm

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"gorm.io/gorm"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Outbox is an outbox at one set of table names, and every verb of this package goes through
// one: [Default] is the outbox at the default names, [New] makes one at others. The verbs that
// are generic over the event type ([Idempotent], [SkipSeen]) are functions that take the Outbox
// first, since Go methods cannot have type parameters; the others are its methods. An Outbox is
// immutable and safe for concurrent use; it serves every dialect, which each call takes from
// its *gorm.DB.
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

// AllowNoTx lets Publish write through a *gorm.DB that is not in a transaction: each call
// then commits on its own, whatever happens to the caller's other writes. Use it only where
// that is the point (a job that publishes and changes nothing else); without it such a
// call fails with [outbox.ErrNotInTransaction].
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

// Publish writes events inside tx, the *gorm.DB of a db.Transaction callback or of Begin;
// they become visible to the relay when tx commits and vanish if it rolls back. An event
// that cannot be encoded, or that breaks the rules of [outbox.Message]
// (outbox.ErrInvalidEvent), fails the call before anything is written. A nil tx fails with
// [outbox.ErrNotInTransaction], and so does a tx outside a transaction unless the outbox
// was built with [AllowNoTx]. Up to 1000 events cost one statement.
func (o *Outbox) Publish(ctx context.Context, tx *gorm.DB, events ...outbox.Encodable) error {
	d, n, q, err := o.inTx(tx)
	if err != nil {
		return err
	}
	if err := sqlstore.Publish(ctx, d, q, n, events); err != nil {
		return fmt.Errorf("outboxgorm: %w", err)
	}
	return nil
}

// Cancel takes back the scheduled event id (published with outbox.WithDeliverAt or
// WithDelay) inside tx (with AllowNoTx, also outside a transaction), and reports whether it was still scheduled. Once tx commits, the event
// is never delivered; if tx rolls back, it stays scheduled. false means it was not waiting
// any more: it fell due and the relay moved it into the outbox (it is being or was
// delivered), it was cancelled before, or it was never scheduled. See docs/scheduled.md.
func (o *Outbox) Cancel(ctx context.Context, tx *gorm.DB, id uuid.UUID) (bool, error) {
	d, n, q, err := o.inTx(tx)
	if err != nil {
		return false, err
	}
	ok, err := sqlstore.Cancel(ctx, d, q, n, id)
	if err != nil {
		return false, fmt.Errorf("outboxgorm: %w", err)
	}
	return ok, nil
}

// inTx returns the dialect, names and connection of tx, which must be inside a
// transaction unless the outbox allows otherwise (AllowNoTx).
func (o *Outbox) inTx(tx *gorm.DB) (sqlstore.Dialect, *sqlstore.Names, sqlstore.Querier, error) {
	if tx == nil || tx.Statement == nil || outboxdriver.IsNil(tx.Statement.ConnPool) {
		return nil, nil, nil, fmt.Errorf("outboxgorm: %w: got a nil *gorm.DB", outbox.ErrNotInTransaction)
	}
	d, n, err := o.dialect(tx)
	if err != nil {
		return nil, nil, nil, err
	}
	pool := tx.Statement.ConnPool
	if _, inTx := pool.(gorm.TxCommitter); !inTx && !o.allowNoTx {
		return nil, nil, nil, fmt.Errorf("outboxgorm: %w: this *gorm.DB is not inside db.Transaction or Begin (build the Outbox with AllowNoTx to publish outside one)", outbox.ErrNotInTransaction)
	}
	return d, n, sqlstore.StdQuerier(pool), nil
}

// Migrate creates or upgrades the outbox's tables over db's pool; concurrent callers wait
// for each other, and it is safe to call at every start. PostgreSQL and SQLite migrate in
// one transaction. MySQL commits DDL as it goes, so there a lock keeps migrators apart and
// every step is idempotent: an interrupted migration completes at the next call.
func (o *Outbox) Migrate(ctx context.Context, db *gorm.DB) error {
	d, n, err := o.dialect(db)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("outboxgorm: Migrate needs a *gorm.DB over a connection pool: %w", err)
	}
	if err := d.Migrate(ctx, sqlstore.StdDB(sqlDB), n); err != nil {
		return fmt.Errorf("outboxgorm: migrating %s (%s): %w", n.Outbox, d.Name(), err)
	}
	return nil
}

// MigrateTx is Migrate inside the caller's GORM transaction, for applications that run
// their own migrations in one transaction (PostgreSQL, SQLite). On MySQL it fails without
// doing anything: DDL would commit the caller's transaction.
func (o *Outbox) MigrateTx(ctx context.Context, tx *gorm.DB) error {
	d, n, err := o.dialect(tx)
	if err != nil {
		return err
	}
	if d == sqlstore.MySQL {
		return errors.New("outboxgorm: MigrateTx is not possible on MySQL, whose DDL commits the transaction; use Migrate")
	}
	pool := tx.Statement.ConnPool
	if _, inTx := pool.(gorm.TxCommitter); !inTx {
		return fmt.Errorf("outboxgorm: %w: MigrateTx needs a *gorm.DB inside a transaction", outbox.ErrNotInTransaction)
	}
	if err := d.Migrate(ctx, sqlstore.StdTxDB(pool), n); err != nil {
		return fmt.Errorf("outboxgorm: migrating %s (%s): %w", n.Outbox, d.Name(), err)
	}
	return nil
}

// Validate checks, changing nothing, that o's tables are those this version expects: every
// migration applied, none unknown to it, every column the library reads and writes there.
// Call it at start when the schema is migrated by another tool (the SQL of
// "outbox migrate --script"). The error wraps [outbox.ErrSchema] and names every problem.
func (o *Outbox) Validate(ctx context.Context, db *gorm.DB) error {
	d, n, err := o.dialect(db)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("outboxgorm: Validate needs a *gorm.DB over a connection pool: %w", err)
	}
	if err := sqlstore.Validate(ctx, d, sqlstore.StdQuerier(sqlDB), n); err != nil {
		return fmt.Errorf("outboxgorm: %w", err)
	}
	return nil
}

// NewStore returns the relay's store for this outbox over db's connection pool. It fails
// when db is inside a transaction or has no *sql.DB under it.
func (o *Outbox) NewStore(db *gorm.DB) (outboxdriver.Store, error) {
	d, n, err := o.dialect(db)
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("outboxgorm: NewStore needs a *gorm.DB over a connection pool: %w", err)
	}
	return d.Store(sqlstore.StdDB(sqlDB), n), nil
}

// dialect returns the SQL dialect of db's GORM dialector and this outbox's names in it.
func (o *Outbox) dialect(db *gorm.DB) (sqlstore.Dialect, *sqlstore.Names, error) {
	if db == nil || db.Config == nil || db.Dialector == nil {
		return nil, nil, errors.New("outboxgorm: the *gorm.DB has no dialector (open it with gorm.Open)")
	}
	name := db.Dialector.Name()
	d, err := sqlstore.Lookup(name)
	if err != nil {
		return nil, nil, fmt.Errorf("outboxgorm: GORM dialect %q is not supported (postgres, mysql, sqlite): %w", name, err)
	}
	return d, o.names[name], nil
}
