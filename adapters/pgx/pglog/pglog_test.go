package outboxpglog_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pglog"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

func TestMain(m *testing.M) {
	if os.Getenv(childSchema) != "" {
		runChildRelay() // the kill test's relay process; never returns
	}
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

// newLogOutbox is newLogOutboxStopped whose store reads the log until t ends.
func newLogOutbox(t *testing.T, srv *pgxtest.Server) *logOutbox {
	t.Helper()
	o := newLogOutboxStopped(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := o.store.Run(ctx, nil); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return o
}

// newLogOutboxStopped is an outbox in a schema of its own on srv, with its publication, and
// a log store over it that nothing runs yet; its slot and publication are dropped when t
// ends.
func newLogOutboxStopped(t *testing.T, srv *pgxtest.Server) *logOutbox {
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
	s, err := outboxpglog.NewStore(o.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &logOutbox{Outbox: o, store: s, cfg: cfg}
}

// slot is the name of the outbox's slot (the default).
func (o *logOutbox) slot() string { return "txoutbox_" + o.Schema + "_outbox" }

// runningRelay is a relay that runs until stop.
type runningRelay struct{ stop func() }

// runRelay runs a relay over o's store into sender until the returned stop (or t's end).
func (o *logOutbox) runRelay(t *testing.T, sender outbox.Sender) runningRelay {
	t.Helper()
	r, err := relay.New(o.store, sender, &relay.Config{Lease: 2 * time.Second, MaxPollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return runningRelay{stop}
}

// publish commits n events, one per transaction, and returns their IDs.
func (o *logOutbox) publish(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range n {
		e := outbox.New(note{N: i})
		if err := pgx.BeginFunc(context.Background(), o.Pool, func(tx pgx.Tx) error { return o.Publish(context.Background(), tx, e) }); err != nil {
			t.Fatal(err)
		}
		ids[i] = e.ID
	}
	return ids
}

// recorder is an in-memory broker that tells whether events arrived.
type recorder struct{ *outboxmemory.Queue }

func newRecorder() recorder { return recorder{outboxmemory.New(nil)} }

func (r recorder) has(ids []uuid.UUID) bool {
	sent := r.Sent()
	got := make(map[uuid.UUID]bool, len(sent))
	for _, m := range sent {
		got[m.ID] = true
	}
	return !slices.ContainsFunc(ids, func(id uuid.UUID) bool { return !got[id] })
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

// TestStreamsWithoutClaiming: once the store streams, events published one per transaction
// reach the broker without a claim statement — the claim function is renamed away, so a
// poll would fail the relay — and the table is left empty.
func TestStreamsWithoutClaiming(t *testing.T) {
	srv := startServer(t)
	o := newLogOutboxStopped(t, srv)
	ctx := context.Background()
	q := newRecorder()
	run := o.runRelay(t, q)
	waitMode(t, o.store, "stream")
	rename := func(from, to string) {
		if _, err := o.Pool.Exec(ctx, "ALTER FUNCTION "+o.Schema+"."+from+" RENAME TO "+to); err != nil {
			t.Fatal(err)
		}
	}
	rename("outbox_claim", "outbox_claim_away")
	ids := o.publish(t, 200)
	outboxtest.WaitFor(t, 30*time.Second, "the events to be delivered", func() bool { return q.has(ids) })
	if err := o.store.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if m := o.store.Mode(); m != "stream" {
		t.Errorf("the store left streaming (%s) though nothing failed", m)
	}
	// The sender saw every event; the relay's write-backs, and the deletes after them,
	// follow within DeleteInterval.
	outboxtest.WaitFor(t, 10*time.Second, "the delivered rows to be deleted", func() bool {
		return o.store.Sync(ctx) == nil && o.Count(t, "outbox") == 0
	})
	run.stop() // fails the test if a poll met the renamed function
	rename("outbox_claim_away", "outbox_claim")
}

// TestKeyOrderIsCommitOrder: the log brings a key's events in the order their transactions
// commit. An event whose transaction began first but commits last is delivered last, as the
// polling relay does too (docs/ordering.md).
func TestKeyOrderIsCommitOrder(t *testing.T) {
	srv := startServer(t)
	o := newLogOutboxStopped(t, srv)
	ctx := context.Background()
	q := newRecorder()
	o.runRelay(t, q)
	waitMode(t, o.store, "stream")
	late, early := outbox.New(note{N: 1}, outbox.WithKey("k")), outbox.New(note{N: 2}, outbox.WithKey("k"))
	tx, err := o.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := o.Publish(ctx, tx, late); err != nil { // takes the lower seq
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, early) }); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 10*time.Second, "the event committed first", func() bool { return q.has([]uuid.UUID{early.ID}) })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 10*time.Second, "the event committed last", func() bool { return q.has([]uuid.UUID{late.ID}) })
	sent := q.Sent()
	if len(sent) != 2 || sent[0].ID != early.ID || sent[1].ID != late.ID {
		t.Fatalf("delivered %v, want the commit order: early, then late", sent)
	}
}

// TestUnreadableInsertIsDeadLetteredAlone: a row inserted by hand that breaks the rules of a
// message (an empty type, a key with white space around it) comes from the log like any
// other; the relay dead-letters it alone (unreadable-row) and delivers the rest, the
// readable events of its key included (SkipKey).
func TestUnreadableInsertIsDeadLetteredAlone(t *testing.T) {
	srv := startServer(t)
	o := newLogOutboxStopped(t, srv)
	ctx := context.Background()
	q := newRecorder()
	r, err := relay.New(o.store, q, &relay.Config{KeyPolicy: relay.SkipKey, MaxPollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitMode(t, o.store, "stream")
	before := o.publish(t, 3)
	for _, set := range []string{"'', 'k'", "'pglog_test.note', ' padded '"} {
		if _, err := o.Pool.Exec(ctx, "INSERT INTO "+o.Schema+".outbox (id, type, key, content_type, body, created_at) VALUES (gen_random_uuid(), "+set+", 'application/json', '{}', now())"); err != nil {
			t.Fatal(err)
		}
	}
	after := o.publish(t, 3)
	outboxtest.WaitFor(t, 30*time.Second, "the readable events", func() bool { return q.has(before) && q.has(after) })
	dl := o.DeadLetters(t)
	outboxtest.WaitFor(t, 30*time.Second, "two unreadable-row dead letters", func() bool {
		list, err := dl.List(ctx, deadletter.Filter{Kind: deadletter.KindUnreadableRow})
		if err != nil {
			t.Fatal(err)
		}
		return len(list) == 2
	})
	if n := len(q.Sent()); n != 6 {
		t.Errorf("%d messages sent, want the 6 readable ones", n)
	}
}
