package outboxpgx_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
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
}

func newTestOutbox(t testing.TB) *testOutbox {
	t.Helper()
	o := pgxtest.New(t, "t")
	return &testOutbox{Outbox: o.Outbox, pool: o.Pool, schema: o.Schema}
}

func (o *testOutbox) fixture() *outboxtest.StoreFixture {
	return &outboxtest.StoreFixture{
		Store: o.NewStore(o.pool),
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
			rows, _ := o.pool.Query(ctx, "SELECT event_id, stage, reason, attempts FROM "+o.schema+".outbox_dead_letters ORDER BY id")
			return pgx.CollectRows(rows, pgx.RowToStructByPos[outboxtest.DeadLetterRow])
		},
	}
}

type rollback struct{}

func (rollback) Error() string { return "rolled back on purpose" }

var errRollback error = rollback{}

func TestConformance(t *testing.T) {
	outboxtest.ExerciseStore(t, func(t *testing.T) *outboxtest.StoreFixture {
		f := newTestOutbox(t).fixture()
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
