package outboxpgx_test

import (
	"context"
	"os"
	"testing"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChildRelay() // the SIGKILL test's relay process; never returns
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// testOutbox is an outbox in a schema of its own, dropped when the test ends.
type testOutbox struct {
	*outboxpgx.Outbox
	pool   *pgxpool.Pool
	schema string
	pt     *pgxtest.Outbox
}

func newTestOutbox(t testing.TB) *testOutbox {
	t.Helper()
	o := pgxtest.New(t, "t")
	return &testOutbox{Outbox: o.Outbox, pool: o.Pool, schema: o.Schema, pt: o}
}

// store is the outbox's relay store over its pool.
func (o *testOutbox) store(t testing.TB) outboxdriver.Store { return o.pt.Store(t) }

// storeOn is the outbox's relay store over db.
func (o *testOutbox) storeOn(t testing.TB, db outboxpgx.DB) outboxdriver.Store {
	t.Helper()
	return mustStore(t, o.Outbox, db)
}

// deadLetters is the outbox's dead-letter table over its pool.
func (o *testOutbox) deadLetters(t testing.TB) deadletter.Table { return o.pt.DeadLetters(t) }

func (o *testOutbox) fixture(t testing.TB) *outboxtest.StoreFixture {
	return &outboxtest.StoreFixture{
		Store: o.store(t),
		Publish: func(ctx context.Context, commit bool, events ...outbox.Encodable) error {
			return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
				if err := o.Publish(ctx, tx, events...); err != nil {
					return err
				}
				if !commit {
					return errRollback
				}
				return nil
			})
		},
		Pending: func(ctx context.Context) (n int, err error) {
			err = o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".outbox").Scan(&n)
			return n, err
		},
		DeadLetters: func(ctx context.Context) ([]outboxtest.DeadLetterRow, error) {
			rows, _ := o.pool.Query(ctx, "SELECT coalesce(event_id, '00000000-0000-0000-0000-000000000000'), stage, reason, attempts FROM "+o.schema+".outbox_dead_letters ORDER BY id")
			return pgx.CollectRows(rows, pgx.RowToStructByPos[outboxtest.DeadLetterRow])
		},
		Cancel: func(ctx context.Context, commit bool, id uuid.UUID) (ok bool, err error) {
			err = pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
				if ok, err = o.Cancel(ctx, tx, id); err != nil {
					return err
				}
				if !commit {
					return errRollback
				}
				return nil
			})
			if err == errRollback {
				err = nil
			}
			return ok, err
		},
		PublishNilTx: func(ctx context.Context, events ...outbox.Encodable) error {
			return o.Publish(ctx, (*pgxpool.Tx)(nil), events...)
		},
		DeadLetterTable: o.deadLetters(t),
		SQL:             o.rawSQL(),
		Unmigrate: func(ctx context.Context) error {
			_, err := o.pool.Exec(ctx, "DROP SCHEMA "+o.schema+" CASCADE")
			return err
		},
	}
}

// rawSQL reaches the outbox's tables with raw SQL, for the suites' poison tests.
func (o *testOutbox) rawSQL() *outboxtest.RawSQL {
	return &outboxtest.RawSQL{
		Dialect: "postgres",
		Exec: func(ctx context.Context, query string) error {
			_, err := o.pool.Exec(ctx, query)
			return err
		},
		Outbox:      o.schema + ".outbox",
		DeadLetters: o.schema + ".outbox_dead_letters",
		Lock: func(ctx context.Context) (func(), error) {
			tx, err := o.pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE "+o.schema+".outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
				_ = tx.Rollback(ctx)
				return nil, err
			}
			return func() { _ = tx.Rollback(context.Background()) }, nil
		},
		KillWaiting: func(ctx context.Context) (n int, err error) {
			err = o.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
 WHERE NOT granted AND relation = $1::regclass AND pid <> pg_backend_pid()`, o.schema+".outbox").Scan(&n)
			return n, err
		},
	}
}

type rollback struct{}

func (rollback) Error() string { return "rolled back on purpose" }

var errRollback error = rollback{}

func TestConformance(t *testing.T) {
	outboxtest.ExerciseStore(t, func(t *testing.T) *outboxtest.StoreFixture {
		f := newTestOutbox(t).fixture(t)
		inner := f.Publish
		f.Publish = func(ctx context.Context, commit bool, events ...outbox.Encodable) error {
			if err := inner(ctx, commit, events...); err != nil && err != errRollback {
				return err
			}
			return nil
		}
		return f
	})
}
