package outboxpglog_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pglog"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// server is the package's private PostgreSQL with wal_level = logical, started by the first
// test that needs it and crashed when that test ends; tests that share it start it through
// a parent test.
func startServer(t *testing.T) *pgxtest.Server {
	t.Helper()
	return pgxtest.StartServer(t, pgxtest.LogicalSettings...)
}

// logOutbox is an outbox in a schema of its own on srv, with its publication, and a log
// store over it that reads the log until the test ends.
type logOutbox struct {
	*pgxtest.Outbox
	store *outboxpglog.Store
	cfg   *outboxpglog.Config
}

// testConfig is a store's config for tests: short intervals.
func testConfig(schema string) *outboxpglog.Config {
	return &outboxpglog.Config{
		Tables:        outbox.Tables{Schema: schema},
		StandbyRetry:  100 * time.Millisecond,
		SweepInterval: 100 * time.Millisecond,
		StaleAfter:    2 * time.Second,
	}
}

func newLogOutbox(t *testing.T, srv *pgxtest.Server) *logOutbox {
	t.Helper()
	o := pgxtest.NewOn(t, srv.URL(), "l")
	cfg := testConfig(o.Schema)
	ctx := context.Background()
	if err := outboxpglog.CreatePublication(ctx, o.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := outboxpglog.Drop(context.Background(), o.Pool, cfg); err != nil {
			t.Error(err)
		}
	})
	return &logOutbox{Outbox: o, store: newStore(t, o, cfg), cfg: cfg}
}

// newStore returns a log store over o that reads the log until t ends.
func newStore(t *testing.T, o *pgxtest.Outbox, cfg *outboxpglog.Config) *outboxpglog.Store {
	t.Helper()
	s, err := outboxpglog.NewStore(o.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.Run(ctx, nil); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return s
}

// waitMode waits until s is in mode m.
func waitMode(t *testing.T, s *outboxpglog.Store, m string) {
	t.Helper()
	outboxtest.WaitFor(t, 20*time.Second, "the store to "+m, func() bool { return s.Mode() == m })
}

func TestConformance(t *testing.T) {
	srv := startServer(t)
	outboxtest.ExerciseStore(t, func(t *testing.T) *outboxtest.StoreFixture {
		o := newLogOutbox(t, srv)
		waitMode(t, o.store, "stream")
		return o.fixture(t)
	})
}

// fixture is the conformance suite's fixture of o's log store. The suite claims right after
// a commit, so Publish waits until the store read it (Sync); it changes rows by hand and
// drops the schema, which the log does not carry, so those make the store poll (Resync).
func (o *logOutbox) fixture(t *testing.T) *outboxtest.StoreFixture {
	f := o.Fixture(t, o.store)
	publish := f.Publish
	f.Publish = func(ctx context.Context, commit bool, events ...outbox.Encodable) error {
		if err := publish(ctx, commit, events...); err != nil && !errors.Is(err, pgxtest.ErrRollback) {
			return err
		}
		return o.store.Sync(ctx)
	}
	exec := f.SQL.Exec
	f.SQL.Exec = func(ctx context.Context, query string) error {
		err := exec(ctx, query)
		return errors.Join(err, o.store.Resync(ctx))
	}
	pending := f.Pending
	f.Pending = func(ctx context.Context) (int, error) {
		if err := o.store.Sync(ctx); err != nil {
			return 0, err
		}
		return pending(ctx)
	}
	// A streaming claim reads no table, so no connection can be dropped under it; the
	// polling store's suite covers the polls'.
	f.SQL.Lock = nil
	unmigrate := f.Unmigrate
	f.Unmigrate = func(ctx context.Context) error {
		err := unmigrate(ctx)
		return errors.Join(err, o.store.Resync(ctx))
	}
	return f
}
