// Package outboxpgx stores txoutbox events in PostgreSQL through pgx v5: Publish writes them
// in the caller's pgx transaction (one round trip for one event, COPY for many), NewStore
// gives the relay its leased claims over a pgxpool.Pool, and Idempotent runs a consumer's
// handler in a transaction that also records the event in the inbox. It is for application
// developers on pgx.
//
// Every verb goes through an [Outbox]: [Default] for the default table names, or one from
// [New] for others.
//
//	err := outboxpgx.Default.Publish(ctx, tx, outbox.New(OrderPlaced{ID: id}))
//	billing, err := outboxpgx.New(outbox.Tables{Schema: "billing"})
//	h := outboxpgx.Idempotent(billing, pool, handle, nil)
//
// outboxgorm, outboxbun and outboxsql have the same verbs, with the same names, arguments
// (each library's own handles) and results.
package outboxpgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/internal/pgxdb"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Tx is what Publish writes through: a pgx.Tx, or anything with the same methods. A pool or
// a bare connection does not qualify: the events must commit with the caller's changes.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// DB is what the relay store and Migrate use: a *pgxpool.Pool or a *pgx.Conn.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Outbox is an outbox at one set of table names, and every verb of this package goes through
// one: [Default] is the outbox at the default names, [New] makes one at others. The verbs that
// are generic over the event type ([Idempotent], [SkipSeen]) are functions that take the Outbox
// first, since Go methods cannot have type parameters; the others are its methods. An Outbox is
// immutable and safe for concurrent use.
type Outbox struct {
	names *sqlstore.Names
}

// Default is the outbox at the default table names: "outbox", "outbox_dead_letters",
// "outbox_inbox"… in the schema of the connection's search_path.
var Default = sqlstore.MustOutbox(New(outbox.Tables{}))

// New validates t and returns the outbox at those names.
func New(t outbox.Tables) (*Outbox, error) {
	n, err := sqlstore.NewNames(sqlstore.Postgres, t)
	if err != nil {
		return nil, err
	}
	return &Outbox{names: n}, nil
}

// copyThreshold is the batch size from which COPY beats a multi-row INSERT: COPY costs an
// extra round trip to describe the table, repaid from a few dozen rows on.
const copyThreshold = 32

// Publish writes events inside tx; they become visible to the relay when tx commits and
// vanish if it rolls back. An event that cannot be encoded fails the call before anything
// is written, so the caller can roll back; so does an event that breaks the rules of
// [outbox.Message] (outbox.ErrInvalidEvent). A nil tx, typed or not, fails with
// outbox.ErrNotInTransaction. One event costs one round trip.
func (o *Outbox) Publish(ctx context.Context, tx Tx, events ...outbox.Encodable) error {
	if outboxdriver.IsNil(tx) {
		return fmt.Errorf("outboxpgx: %w: got a nil %T", outbox.ErrNotInTransaction, tx)
	}
	msgs, err := outboxdriver.Encode(ctx, events)
	if err != nil || len(msgs) == 0 {
		return err
	}
	msgs, err = sqlstore.PublishScheduled(ctx, sqlstore.Postgres, querier{Q: tx}, o.names, msgs)
	switch {
	case err != nil || len(msgs) == 0:
	case len(msgs) < copyThreshold:
		err = sqlstore.Postgres.Insert(ctx, querier{Q: tx}, o.names, msgs)
	default:
		err = o.copy(ctx, tx, msgs)
	}
	if err != nil {
		return fmt.Errorf("outboxpgx: publishing %d event(s): %w", len(msgs), sqlstore.Classify(err, o.names))
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
		return false, fmt.Errorf("outboxpgx: %w: got a nil %T", outbox.ErrNotInTransaction, tx)
	}
	ok, err := sqlstore.Cancel(ctx, sqlstore.Postgres, querier{Q: tx}, o.names, id)
	if err != nil {
		return false, fmt.Errorf("outboxpgx: %w", err)
	}
	return ok, nil
}

func (o *Outbox) copy(ctx context.Context, tx Tx, msgs []outbox.Message) error {
	table := pgx.Identifier{o.names.Prefix}
	if o.names.Schema != "" {
		table = pgx.Identifier{o.names.Schema, o.names.Prefix}
	}
	_, err := tx.CopyFrom(ctx, table,
		[]string{"id", "type", "key", "headers", "content_type", "body", "created_at"},
		pgx.CopyFromSlice(len(msgs), func(i int) ([]any, error) {
			m := msgs[i]
			return []any{m.ID, m.Type, m.Key, sqlstore.HeadersJSON(m.Headers), m.ContentType, m.Body, m.CreatedAt}, nil
		}))
	return err
}

// Migrate creates or upgrades the outbox's tables in one transaction; concurrent callers
// wait for each other. It is safe to call at every start.
func (o *Outbox) Migrate(ctx context.Context, db DB) error {
	if db == nil {
		return errors.New("outboxpgx: Migrate needs a database (a *pgxpool.Pool), got nil")
	}
	if err := sqlstore.Postgres.Migrate(ctx, pool{DB: db}, o.names); err != nil {
		return fmt.Errorf("outboxpgx: migrating: %w", err)
	}
	return nil
}

// MigrateTx is Migrate inside the caller's transaction, for applications that run their
// own migrations in one transaction.
func (o *Outbox) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return fmt.Errorf("outboxpgx: %w: MigrateTx got a nil pgx.Tx", outbox.ErrNotInTransaction)
	}
	if err := sqlstore.Postgres.Migrate(ctx, pool{DB: tx}, o.names); err != nil {
		return fmt.Errorf("outboxpgx: migrating: %w", err)
	}
	return nil
}

// Validate checks, changing nothing, that o's tables are those this version expects: every
// migration applied, none unknown to it, every column the library reads and writes there.
// Call it at start when the schema is migrated by another tool (the SQL of
// "outbox migrate --script"). The error wraps [outbox.ErrSchema] and names every problem.
func (o *Outbox) Validate(ctx context.Context, db DB) error {
	if db == nil {
		return errors.New("outboxpgx: Validate needs a database (a *pgxpool.Pool), got nil")
	}
	if err := sqlstore.Validate(ctx, sqlstore.Postgres, pool{DB: db}, o.names); err != nil {
		return fmt.Errorf("outboxpgx: %w", err)
	}
	return nil
}

// NewStore returns the relay's store for this outbox over db (normally a *pgxpool.Pool).
func (o *Outbox) NewStore(db DB) (outboxdriver.Store, error) {
	if db == nil {
		return nil, errors.New("outboxpgx: NewStore needs a database (a *pgxpool.Pool), got nil")
	}
	return sqlstore.Postgres.Store(pool{DB: db}, o.names), nil
}

// querier and pool adapt pgx handles to sqlstore's interfaces (shared with outboxpglog).
type (
	querier = pgxdb.Querier
	pool    = pgxdb.Pool
)
