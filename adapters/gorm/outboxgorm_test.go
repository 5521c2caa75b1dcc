package outboxgorm_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/glebarez/sqlite"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun/driver/pgdriver"
	"go.uber.org/goleak"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/txoutbox/outbox"
	outboxgorm "github.com/txoutbox/outbox/adapters/gorm"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

func TestMain(m *testing.M) {
	// GORM's PrepareStmt cache runs a cleanup goroutine that it never stops (see
	// gorm.io/gorm/internal/lru): GORM's, not ours.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"))
}

// setups are the GORM configurations every test runs on: each dialect, and PostgreSQL on a
// second database/sql driver (bun's pgdriver) besides pgx's stdlib.
var setups = []struct {
	name, dialect string
	open          func(dsn string) (*sql.DB, error)
	gorm          func(db *sql.DB) gorm.Dialector
}{
	{"postgres", "postgres",
		func(dsn string) (*sql.DB, error) { return sql.Open("pgx", dsn) },
		func(db *sql.DB) gorm.Dialector { return postgres.New(postgres.Config{Conn: db}) }},
	{"postgres-pgdriver", "postgres",
		func(dsn string) (*sql.DB, error) {
			return sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn))), nil
		},
		func(db *sql.DB) gorm.Dialector { return postgres.New(postgres.Config{Conn: db}) }},
	{"mysql", "mysql",
		func(dsn string) (*sql.DB, error) { return sql.Open("mysql", dsn) },
		func(db *sql.DB) gorm.Dialector { return mysql.New(mysql.Config{Conn: db}) }},
	{"sqlite", "sqlite",
		func(dsn string) (*sql.DB, error) { return sql.Open(sqlite.DriverName, dsn) },
		func(db *sql.DB) gorm.Dialector { return &sqlite.Dialector{Conn: db} }},
}

type testOutbox struct {
	*outboxgorm.Outbox
	*sqlstoretest.Target
	db *gorm.DB
}

func newTestOutbox(t testing.TB, i int, opts ...outboxgorm.Option) *testOutbox {
	t.Helper()
	s := setups[i]
	tg := sqlstoretest.New(t, s.dialect, s.open)
	db, err := gorm.Open(s.gorm(tg.DB), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	// The default names (SQLite) go through outboxgorm.Default, the others through New.
	o := outboxgorm.Default
	if !tg.DefaultNames() || len(opts) > 0 {
		if o, err = outboxgorm.New(tg.Tables, opts...); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return &testOutbox{Outbox: o, Target: tg, db: db}
}

// inTx runs fn in one db.Transaction, committed, or rolled back when commit is false.
func (o *testOutbox) inTx(ctx context.Context, commit bool, fn func(tx *gorm.DB) error) error {
	err := o.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := fn(tx); err != nil {
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
	return o.inTx(ctx, commit, func(tx *gorm.DB) error { return o.Publish(ctx, tx, events...) })
}

// cancel is the fixtures' Cancel, in one transaction.
func (o *testOutbox) cancel(ctx context.Context, commit bool, id uuid.UUID) (ok bool, err error) {
	err = o.inTx(ctx, commit, func(tx *gorm.DB) (err error) { ok, err = o.Cancel(ctx, tx, id); return err })
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
					tx := o.db.WithContext(ctx).Session(&gorm.Session{})
					tx.Statement.ConnPool = (*sql.Tx)(nil)
					return o.Publish(ctx, tx, events...)
				}
				return f
			})
		})
	}
}

// Order is a business row.
type Order struct {
	ID    int64
	Total int64
}

type OrderPlaced struct {
	OrderID int64 `json:"order_id"`
}

func (OrderPlaced) EventType() string { return "orders.placed" }

// TestOrderAndEventCommitTogether: an order created with GORM and its event, in one
// db.Transaction, both commit; when the callback fails, both roll back.
func TestOrderAndEventCommitTogether(t *testing.T) {
	for i, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := newTestOutbox(t, i)
			orders := o.Table("orders")
			db := o.db.WithContext(ctx)
			if err := db.Table(orders).AutoMigrate(&Order{}); err != nil {
				t.Fatal(err)
			}
			place := func(id int64, fail error) error {
				return db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Table(orders).Create(&Order{ID: id, Total: 42}).Error; err != nil {
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
				t.Fatalf("Transaction returned %v, want %v", err, boom)
			}

			var rows int64
			if err := db.Table(orders).Count(&rows).Error; err != nil {
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

// TestPublishOutsideTransaction: a *gorm.DB that is not in a transaction is refused unless
// the outbox allows it.
func TestPublishOutsideTransaction(t *testing.T) {
	const sqliteSetup = 3
	ctx := context.Background()
	strict := newTestOutbox(t, sqliteSetup)
	err := strict.Publish(ctx, strict.db, outbox.New(OrderPlaced{1}))
	if !errors.Is(err, outbox.ErrNotInTransaction) {
		t.Fatalf("Publish outside a transaction = %v, want ErrNotInTransaction", err)
	}
	if err := outboxgorm.Default.Publish(ctx, nil, outbox.New(OrderPlaced{1})); !errors.Is(err, outbox.ErrNotInTransaction) {
		t.Fatalf("Publish(nil) = %v, want ErrNotInTransaction", err)
	}

	lax := newTestOutbox(t, sqliteSetup, outboxgorm.AllowNoTx())
	if err := lax.Publish(ctx, lax.db, outbox.New(OrderPlaced{1})); err != nil {
		t.Fatalf("Publish with AllowNoTx: %v", err)
	}
	if n, err := lax.Pending(ctx); err != nil || n != 1 {
		t.Fatalf("%d pending (%v), want 1", n, err)
	}
}

// TestMigrate runs the migration suite on every setup, through outboxgorm.Default where the
// outbox has the default names (SQLite).
func TestMigrate(t *testing.T) {
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseMigrate(t, func(t *testing.T) *outboxtest.MigrateFixture[*gorm.DB] {
				tg := sqlstoretest.New(t, s.dialect, s.open)
				db, err := gorm.Open(s.gorm(tg.DB), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
				if err != nil {
					t.Fatal(err)
				}
				o := outboxgorm.Default
				if !tg.DefaultNames() {
					if o, err = outboxgorm.New(tg.Tables); err != nil {
						t.Fatal(err)
					}
				}
				return &outboxtest.MigrateFixture[*gorm.DB]{
					Migrate:   func(ctx context.Context) error { return o.Migrate(ctx, db) },
					MigrateTx: o.MigrateTx,
					Validate:  func(ctx context.Context) error { return o.Validate(ctx, db) },
					InTx: func(ctx context.Context, fn func(*gorm.DB) error) error {
						return db.WithContext(ctx).Transaction(fn)
					},
					Migrated:   tg.Migrated,
					Versions:   tg.Versions(),
					DDLCommits: s.dialect == "mysql",
				}
			})
		})
	}
}

// TestRelayedByOutboxsql: events written through GORM are delivered, intact and in order,
// by a relay on the database/sql adapter's store over the same tables.
func TestRelayedByOutboxsql(t *testing.T) {
	dialects := map[string]*outboxsql.Outbox{"postgres": outboxsql.Postgres, "mysql": outboxsql.MySQL, "sqlite": outboxsql.SQLite}
	for i, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := newTestOutbox(t, i)
			var events []outbox.Encodable
			for n := range 20 {
				events = append(events, outbox.New(outboxtest.Note{Text: "from gorm", N: n},
					outbox.WithKey("k"), outbox.WithHeader("source", "gorm")))
			}
			if err := o.publish(ctx, true, events...); err != nil {
				t.Fatal(err)
			}
			other, err := outboxsql.New(dialects[s.dialect], o.Tables)
			if err != nil {
				t.Fatal(err)
			}
			q := outboxmemory.New(nil)
			store, err := other.NewStore(o.DB)
			if err != nil {
				t.Fatal(err)
			}
			outboxtest.RunRelays(t, store, q, 1, &relay.Config{Name: "outboxsql"},
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

// TestIdempotency runs the idempotency suite on every setup: through outboxgorm.Default
// where the outbox has the default names (SQLite), through an Outbox from New otherwise.
func TestIdempotency(t *testing.T) {
	for i, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture[*gorm.DB] {
				return newTestOutbox(t, i).idempotencyFixture(t)
			})
		})
	}
}

func (o *testOutbox) idempotencyFixture(t *testing.T) *outboxtest.IdempotencyFixture[*gorm.DB] {
	effects := o.EffectsTable(t)
	f := &outboxtest.IdempotencyFixture[*gorm.DB]{
		Effect: func(ctx context.Context, tx *gorm.DB, id, text string) error {
			return tx.WithContext(ctx).Exec("INSERT INTO "+effects+" (id, text) VALUES (?, ?)", id, text).Error
		},
		Effects:   func(ctx context.Context) (map[string]int, error) { return o.CountByText(ctx, effects) },
		Pending:   o.Pending,
		AgeInbox:  o.AgeInbox,
		SQL:       o.RawSQL(),
		Unmigrate: o.Unmigrate,
		Publish:   o.Publish,
		Idempotent: func(h idempotency.TxHandler[*gorm.DB, outboxtest.Note], cfg *idempotency.GroupConfig) consumer.Handler[outboxtest.Note] {
			return outboxgorm.Idempotent(o.Outbox, o.db, outboxgorm.TxHandler[outboxtest.Note](h), cfg)
		},
		SkipSeen: func(h consumer.Handler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxgorm.SkipSeen(o.Outbox, o.db, h)
		},
		IdempotentHTTP: func(h idempotency.HTTPTxHandler[*gorm.DB], cfg *idempotency.HTTPConfig) http.Handler {
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

// TestPrepareStmt: with GORM's PrepareStmt mode the connection pool and transactions are
// GORM's own wrappers; Publish still tells a transaction from a pool and writes through it.
func TestPrepareStmt(t *testing.T) {
	ctx := context.Background()
	s := setups[3]
	tg := sqlstoretest.New(t, s.dialect, s.open)
	db, err := gorm.Open(s.gorm(tg.DB), &gorm.Config{PrepareStmt: true, Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	if err := outboxgorm.Default.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := outboxgorm.Default.Publish(ctx, db, outbox.New(OrderPlaced{1})); !errors.Is(err, outbox.ErrNotInTransaction) {
		t.Fatalf("Publish on a prepared-statement pool = %v, want ErrNotInTransaction", err)
	}
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return outboxgorm.Default.Publish(ctx, tx, outbox.New(OrderPlaced{2}))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := tg.Pending(ctx); err != nil || n != 1 {
		t.Fatalf("%d pending (%v), want 1", n, err)
	}
	if _, err := outboxgorm.Default.NewStore(db); err != nil {
		t.Fatal(err)
	}
}
