package outboxbun_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/schema"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/outbox"
	outboxbun "github.com/txoutbox/outbox/adapters/bun"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// setups are the bun configurations every test runs on: PostgreSQL on bun's pgdriver and
// on pgx's stdlib driver, MySQL/MariaDB and SQLite.
var setups = []struct {
	name, dialect string
	open          func(dsn string) (*sql.DB, error)
	bun           func() schema.Dialect
}{
	{"postgres-pgdriver", "postgres",
		func(dsn string) (*sql.DB, error) {
			return sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn))), nil
		},
		func() schema.Dialect { return pgdialect.New() }},
	{"postgres-pgx", "postgres",
		func(dsn string) (*sql.DB, error) { return sql.Open("pgx", dsn) },
		func() schema.Dialect { return pgdialect.New() }},
	{"mysql", "mysql",
		func(dsn string) (*sql.DB, error) { return sql.Open("mysql", dsn) },
		func() schema.Dialect { return mysqldialect.New() }},
	{"sqlite", "sqlite",
		func(dsn string) (*sql.DB, error) { return sql.Open("sqlite", dsn) },
		func() schema.Dialect { return sqlitedialect.New() }},
}

type testOutbox struct {
	*outboxbun.Outbox
	*sqlstoretest.Target
	db *bun.DB
}

func newTestOutbox(t testing.TB, i int, opts ...outboxbun.Option) *testOutbox {
	t.Helper()
	s := setups[i]
	tg := sqlstoretest.New(t, s.dialect, s.open)
	db := bun.NewDB(tg.DB, s.bun())
	// The default names (SQLite) go through outboxbun.Default, the others through New.
	o := outboxbun.Default
	if !tg.DefaultNames() || len(opts) > 0 {
		var err error
		if o, err = outboxbun.New(tg.Tables, opts...); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return &testOutbox{Outbox: o, Target: tg, db: db}
}

// inTx runs fn in one db.RunInTx, committed, or rolled back when commit is false.
func (o *testOutbox) inTx(ctx context.Context, commit bool, fn func(ctx context.Context, tx bun.Tx) error) error {
	err := o.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if !commit {
			return sqlstoretest.ErrRollback
		}
		return nil
	})
	if errors.Is(err, sqlstoretest.ErrRollback) {
		return nil
	}
	return err
}

// publish is the fixtures' Publish, in one transaction.
func (o *testOutbox) publish(ctx context.Context, commit bool, events ...outbox.Encodable) error {
	return o.inTx(ctx, commit, func(ctx context.Context, tx bun.Tx) error { return o.Publish(ctx, tx, events...) })
}

// cancel is the fixtures' Cancel, in one transaction.
func (o *testOutbox) cancel(ctx context.Context, commit bool, id uuid.UUID) (ok bool, err error) {
	err = o.inTx(ctx, commit, func(ctx context.Context, tx bun.Tx) (err error) { ok, err = o.Cancel(ctx, tx, id); return err })
	return ok, err
}

func TestConformance(t *testing.T) {
	for i, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseStore(t, func(t *testing.T) *outboxtest.StoreFixture {
				o := newTestOutbox(t, i)
				store, err := o.NewStore(o.db)
				if err != nil {
					t.Fatal(err)
				}
				f := o.Fixture(store, o.publish)
				f.Cancel = o.cancel
				f.PublishNilTx = func(ctx context.Context, events ...outbox.Encodable) error {
					return o.Publish(ctx, (*bun.Tx)(nil), events...)
				}
				return f
			})
		})
	}
}

// Order is a business row.
type Order struct {
	ID    int64 `bun:",pk"`
	Total int64 `bun:",notnull"`
}

type OrderPlaced struct {
	OrderID int64 `json:"order_id"`
}

func (OrderPlaced) EventType() string { return "orders.placed" }

// TestOrderAndEventCommitTogether: an order inserted with bun and its event, in one
// db.RunInTx, both commit; when the function fails, both roll back.
func TestOrderAndEventCommitTogether(t *testing.T) {
	for i, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := newTestOutbox(t, i)
			orders := o.Table("orders")
			if _, err := o.db.NewCreateTable().Model((*Order)(nil)).ModelTableExpr(orders).Exec(ctx); err != nil {
				t.Fatal(err)
			}
			place := func(id int64, fail error) error {
				return o.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
					if _, err := tx.NewInsert().Model(&Order{ID: id, Total: 42}).ModelTableExpr(orders).Exec(ctx); err != nil {
						return err
					}
					if err := o.Publish(ctx, tx, outbox.New(OrderPlaced{id}, outbox.WithKey("orders"))); err != nil {
						return err
					}
					return fail
				})
			}
			if err := place(1, nil); err != nil {
				t.Fatal(err)
			}
			boom := errors.New("payment declined")
			if err := place(2, boom); !errors.Is(err, boom) {
				t.Fatalf("RunInTx returned %v, want %v", err, boom)
			}

			rows, err := o.db.NewSelect().Model((*Order)(nil)).ModelTableExpr(orders).Count(ctx)
			if err != nil {
				t.Fatal(err)
			}
			store, err := o.NewStore(o.db)
			if err != nil {
				t.Fatal(err)
			}
			q := outboxmemory.New(nil)
			relay, err := relay.New(store, q, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := relay.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			sent := q.Sent()
			if rows != 1 || len(sent) != 1 {
				t.Fatalf("%d orders and %d events delivered, want 1 and 1", rows, len(sent))
			}
			if e, err := outbox.Decode[OrderPlaced](sent[0]); err != nil || e.Payload.OrderID != 1 {
				t.Fatalf("delivered %+v (%v), want order 1", e, err)
			}
		})
	}
}

// TestPublishOutsideTransaction: a *bun.DB or bun.Conn is refused unless the outbox allows
// it; a nested transaction (a savepoint) is a transaction.
func TestPublishOutsideTransaction(t *testing.T) {
	const sqliteSetup = 3
	ctx := context.Background()
	strict := newTestOutbox(t, sqliteSetup)
	if err := strict.Publish(ctx, strict.db, outbox.New(OrderPlaced{1})); !errors.Is(err, outbox.ErrNotInTransaction) {
		t.Fatalf("Publish on a *bun.DB = %v, want ErrNotInTransaction", err)
	}
	conn, err := strict.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := strict.Publish(ctx, conn, outbox.New(OrderPlaced{1})); !errors.Is(err, outbox.ErrNotInTransaction) {
		t.Fatalf("Publish on a bun.Conn = %v, want ErrNotInTransaction", err)
	}
	conn.Close()
	if err := outboxbun.Default.Publish(ctx, nil, outbox.New(OrderPlaced{1})); !errors.Is(err, outbox.ErrNotInTransaction) {
		t.Fatalf("Publish(nil) = %v, want ErrNotInTransaction", err)
	}
	err = strict.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		return tx.RunInTx(ctx, nil, func(ctx context.Context, nested bun.Tx) error {
			return strict.Publish(ctx, nested, outbox.New(OrderPlaced{1}))
		})
	})
	if err != nil {
		t.Fatalf("Publish in a nested transaction: %v", err)
	}

	lax := newTestOutbox(t, sqliteSetup, outboxbun.AllowNoTx())
	if err := lax.Publish(ctx, lax.db, outbox.New(OrderPlaced{1})); err != nil {
		t.Fatalf("Publish with AllowNoTx: %v", err)
	}
	for _, o := range []*testOutbox{strict, lax} {
		if n, err := o.Pending(ctx); err != nil || n != 1 {
			t.Fatalf("%d pending (%v), want 1", n, err)
		}
	}
}

// TestMigrate runs the migration suite on every setup, through outboxbun.Default where the
// outbox has the default names (SQLite).
func TestMigrate(t *testing.T) {
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseMigrate(t, func(t *testing.T) *outboxtest.MigrateFixture[bun.Tx] {
				tg := sqlstoretest.New(t, s.dialect, s.open)
				db := bun.NewDB(tg.DB, s.bun())
				o := outboxbun.Default
				if !tg.DefaultNames() {
					var err error
					if o, err = outboxbun.New(tg.Tables); err != nil {
						t.Fatal(err)
					}
				}
				return &outboxtest.MigrateFixture[bun.Tx]{
					Migrate:   func(ctx context.Context) error { return o.Migrate(ctx, db) },
					MigrateTx: o.MigrateTx,
					Validate:  func(ctx context.Context) error { return o.Validate(ctx, db) },
					InTx: func(ctx context.Context, fn func(bun.Tx) error) error {
						return db.RunInTx(ctx, nil, func(_ context.Context, tx bun.Tx) error { return fn(tx) })
					},
					Migrated:   tg.Migrated,
					Versions:   tg.Versions(),
					DDLCommits: s.dialect == "mysql",
				}
			})
		})
	}
}

// TestRelayedByOtherAdapters: events written through bun are delivered, intact and in
// order, by a relay on another adapter's store over the same tables: outboxpgx's (on its
// own pgxpool) for PostgreSQL, outboxsql's for MySQL and SQLite.
func TestRelayedByOtherAdapters(t *testing.T) {
	for i, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := newTestOutbox(t, i)
			var events []outbox.Encodable
			for n := range 20 {
				events = append(events, outbox.New(outboxtest.Note{Text: "from bun", N: n},
					outbox.WithKey("k"), outbox.WithHeader("source", "bun")))
			}
			if err := o.publish(ctx, true, events...); err != nil {
				t.Fatal(err)
			}
			var store outboxdriver.Store
			switch s.dialect {
			case "postgres":
				pool, err := pgxpool.New(ctx, o.DSN)
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				other, err := outboxpgx.New(o.Tables)
				if err != nil {
					t.Fatal(err)
				}
				if store, err = other.NewStore(pool); err != nil {
					t.Fatal(err)
				}
			default:
				d := outboxsql.MySQL
				if s.dialect == "sqlite" {
					d = outboxsql.SQLite
				}
				other, err := outboxsql.New(d, o.Tables)
				if err != nil {
					t.Fatal(err)
				}
				if store, err = other.NewStore(o.DB); err != nil {
					t.Fatal(err)
				}
			}
			q := outboxmemory.New(nil)
			outboxtest.RunRelays(t, store, q, 1, &relay.Config{Name: "other"},
				func() bool { return len(q.Sent()) == len(events) })
			for n, m := range q.Sent() {
				want, _ := events[n].Encode()
				if err := outboxtest.SameMessage(m, want); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestIdempotency runs the idempotency suite on every setup: through outboxbun.Default
// where the outbox has the default names (SQLite), through an Outbox from New otherwise.
func TestIdempotency(t *testing.T) {
	for i, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture[bun.Tx] {
				return newTestOutbox(t, i).idempotencyFixture(t)
			})
		})
	}
}

func (o *testOutbox) idempotencyFixture(t *testing.T) *outboxtest.IdempotencyFixture[bun.Tx] {
	effects := o.EffectsTable(t)
	f := &outboxtest.IdempotencyFixture[bun.Tx]{
		Effect: func(ctx context.Context, tx bun.Tx, id, text string) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO "+effects+" (id, text) VALUES (?, ?)", id, text)
			return err
		},
		Effects:   func(ctx context.Context) (map[string]int, error) { return o.CountByText(ctx, effects) },
		Pending:   o.Pending,
		AgeInbox:  o.AgeInbox,
		SQL:       o.RawSQL(),
		Unmigrate: o.Unmigrate,
		Publish: func(ctx context.Context, tx bun.Tx, events ...outbox.Encodable) error {
			return o.Publish(ctx, tx, events...)
		},
		Idempotent: func(h idempotency.TxHandler[bun.Tx, outboxtest.Note], cfg *idempotency.GroupConfig) consumer.Handler[outboxtest.Note] {
			return outboxbun.Idempotent(o.Outbox, o.db, outboxbun.TxHandler[outboxtest.Note](h), cfg)
		},
		SkipSeen: func(h consumer.Handler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxbun.SkipSeen(o.Outbox, o.db, h)
		},
		IdempotentHTTP: func(h idempotency.HTTPTxHandler[bun.Tx], cfg *idempotency.HTTPConfig) http.Handler {
			return o.IdempotentHTTP(o.db, h, cfg)
		},
		PruneInbox: func(ctx context.Context, retention time.Duration, limit int) (int64, error) {
			return o.PruneInbox(ctx, o.db, retention, limit)
		},
	}
	var err error
	f.Store, err = o.NewStore(o.db)
	if err == nil {
		f.DeadLetters, err = o.NewDeadLetters(o.db)
	}
	if err == nil {
		f.Inbox, err = o.NewInbox(o.db)
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}
