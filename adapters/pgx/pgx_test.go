package outboxpgx_test

import (
	"context"
	"os"
	"testing"

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
	return o.pt.Fixture(t, o.store(t))
}

// rawSQL reaches the outbox's tables with raw SQL, for the suites' poison tests.
func (o *testOutbox) rawSQL() *outboxtest.RawSQL { return o.pt.RawSQL() }

var errRollback = pgxtest.ErrRollback

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
