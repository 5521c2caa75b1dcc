// Package pgxtest gives each test an outbox of its own in PostgreSQL: a fresh schema,
// migrated, and dropped when the test ends, so tests run in parallel against one server.
// txoutbox's transport tests use it; it serves the tests of applications as well:
//
//	func TestCheckoutPublishes(t *testing.T) {
//		o := pgxtest.New(t, "checkout") // schema checkout_<random>, migrated
//		o.Commit(t, outbox.New(OrderPlaced{ID: "o-1"}, outbox.WithKey("o-1")))
//		relay, err := relay.New(o.Store(t), sender, nil)
//		…
//		outboxtest.WaitFor(t, 10*time.Second, "the outbox to drain", func() bool {
//			return o.Count(t, "outbox") == 0
//		})
//	}
//
// [StartServer] starts a PostgreSQL server of the test's own, for tests that stop, crash or
// restart their database (the shared one must never be).
package pgxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
)

// URL returns $TXOUTBOX_PG_URL, or the local test database ([outboxtest.PostgresURL]).
func URL() string { return outboxtest.PostgresURL() }

// RequireServer makes sure a PostgreSQL server answers at url within 3 seconds: a failure
// when $CI is set, a skip otherwise ([outboxtest.RequireService]). For the tests of
// programs that open their own pool, such as the examples.
func RequireServer(t testing.TB, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		err = conn.Close(ctx)
	}
	outboxtest.RequireService(t, "PostgreSQL at "+outboxtest.Shown(url), err)
}

// Outbox is an outbox in a schema of its own, with the pool it was created on.
type Outbox struct {
	*outboxpgx.Outbox
	Pool   *pgxpool.Pool
	Schema string // prefix_<random hex>
	url    string
}

// New connects to URL(), creates and migrates the schema prefix_<random hex> (prefix must
// be a plain lower-case identifier), and drops it and closes the pool when t ends. An
// unreachable server is outboxtest.RequireService's business: a failure when $CI is set, a
// skip otherwise.
func New(t testing.TB, prefix string) *Outbox {
	t.Helper()
	return NewOn(t, URL(), prefix)
}

// NewOn is New on the server at url (a [Server] of the test's own).
func NewOn(t testing.TB, url, prefix string) *Outbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	outboxtest.RequireService(t, "PostgreSQL at "+outboxtest.Shown(url), err)
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	schema := prefix + "_" + hex.EncodeToString(suffix)
	o, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
		pool.Close()
	})
	if err := o.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return &Outbox{Outbox: o, Pool: pool, Schema: schema, url: url}
}

// Store returns the outbox's relay store, failing t on an error.
func (o *Outbox) Store(t testing.TB) outboxdriver.Store {
	t.Helper()
	s, err := o.NewStore(o.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// DeadLetters returns the outbox's dead-letter table, failing t on an error.
func (o *Outbox) DeadLetters(t testing.TB) deadletter.Table {
	t.Helper()
	d, err := o.NewDeadLetters(o.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// SearchPathPool returns a new pool whose connections have the outbox's schema as their
// search_path, closed when t ends: through it, the default table names (outbox.Tables{},
// outboxpgx.Default) reach this outbox's tables.
func (o *Outbox) SearchPathPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(o.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = o.Schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Commit publishes events in one committed transaction, failing t on any error.
func (o *Outbox) Commit(t testing.TB, events ...outbox.Encodable) {
	t.Helper()
	ctx := context.Background()
	tx, err := o.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := o.Publish(ctx, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// Pipeline returns the fixture of a whole pipeline over this outbox, for the suites of
// outboxtest: its Publish commits the events in one transaction on the caller's context
// (which carries the trace context that Publish stores).
func (o *Outbox) Pipeline(t testing.TB, s outbox.Sender, r outbox.Receiver) *outboxtest.PipelineFixture {
	t.Helper()
	return &outboxtest.PipelineFixture{
		Store: o.Store(t),
		Publish: func(ctx context.Context, events ...outbox.Encodable) error {
			return pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, events...) })
		},
		Sender:      s,
		Receiver:    r,
		DeadLetters: o.DeadLetters(t),
		Idempotent: func(h consumer.Handler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxpgx.Idempotent(o.Outbox, o.Pool, func(ctx context.Context, _ pgx.Tx, e outbox.Event[outboxtest.Note]) error {
				return h(ctx, e)
			}, nil)
		},
	}
}

// Count returns the number of rows in one of the schema's tables: "outbox",
// "outbox_dead_letters", "outbox_inbox", or one the test created.
func (o *Outbox) Count(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := o.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+o.Schema+"."+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TaggedPool returns a pool on URL() of at most maxConns connections (0: pgxpool's
// default) whose sessions carry an application_name of their own, closed when t ends, and
// a function returning the PIDs of their server backends at each call (nil when it cannot
// tell): a benchmark reads their CPU time from /proc to tell what its own database work
// costs from what other sessions on the server do.
func TaggedPool(t testing.TB, maxConns int) (pool *pgxpool.Pool, backends func() []int) {
	t.Helper()
	return TaggedPoolOn(t, URL(), maxConns)
}

// TaggedPoolOn is TaggedPool on the server at url (a [Server] of the test's own). Every
// connection made from the pool's config carries the tag, those a store opens beside the
// pool too (outboxpglog's lock and replication connections: its walsender is among the
// backends).
func TaggedPoolOn(t testing.TB, url string, maxConns int) (pool *pgxpool.Pool, backends func() []int) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	tag := make([]byte, 6)
	_, _ = rand.Read(tag)
	app := "pgxtest_" + hex.EncodeToString(tag)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	if pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, func() []int {
		rows, err := pool.Query(context.Background(), "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
		if err != nil {
			return nil
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return nil
		}
		return append([]int{}, pids...) // none yet is an answer too
	}
}
