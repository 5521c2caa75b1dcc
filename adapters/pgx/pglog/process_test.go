package outboxpglog_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pglog"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
)

// The child relay process of the kill test reads these.
const (
	childSchema = "TXOUTBOX_PGLOG_CHILD_SCHEMA"
	childURL    = "TXOUTBOX_PGLOG_CHILD_URL"
	childName   = "TXOUTBOX_PGLOG_CHILD_NAME"
)

// note is the payload of this package's tests.
type note struct {
	N int `json:"n"`
}

func (note) EventType() string { return "pglog_test.note" }

// tableSender records every delivery in a table, one committed INSERT per message, with the
// relay's name: a process killed mid-batch leaves exactly the deliveries it made.
type tableSender struct {
	pool        *pgxpool.Pool
	table, name string
}

func (s tableSender) Send(ctx context.Context, msgs []outbox.Message) error {
	for _, m := range msgs {
		if _, err := s.pool.Exec(ctx, "INSERT INTO "+s.table+" (id, key, relay) VALUES ($1, $2, $3)", m.ID, m.Key, s.name); err != nil {
			return outbox.Unavailable(err) // the database that records deliveries is down
		}
	}
	return nil
}

// runChildRelay is a relay process of the kill test: it relays the schema named in the
// environment through a log store until it is killed.
func runChildRelay() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	schema := os.Getenv(childSchema)
	pool, err := pgxpool.New(ctx, os.Getenv(childURL))
	if err != nil {
		fail(err)
	}
	store, err := outboxpglog.NewStore(pool, testConfig(schema))
	if err != nil {
		fail(err)
	}
	name := os.Getenv(childName)
	r, err := relay.New(store, tableSender{pool, schema + ".delivered", name}, &relay.Config{Name: name, Lease: 2 * time.Second,
		UnavailableBackoff: 20 * time.Millisecond, MaxUnavailableBackoff: 200 * time.Millisecond})
	if err != nil {
		fail(err)
	}
	fmt.Println("running")
	_ = r.Run(ctx)
	os.Exit(0)
}

// TestKillCrashAndTakeOverLoseNothing runs two relay processes on one outbox while events
// are published one per transaction: one reads the log, the other waits as a standby. It
// kills the reader with SIGKILL (the standby takes over; the take-over time is logged),
// then crashes PostgreSQL (pg_ctl -m immediate) and starts it again. Every committed event
// is delivered at least once, every key's events in commit order.
func TestKillCrashAndTakeOverLoseNothing(t *testing.T) {
	outboxtest.SkipIfShort(t, "starts a server and relay processes")
	srv := startServer(t)
	o := newLogOutboxStopped(t, srv) // the relay processes read the log
	ctx := context.Background()
	delivered := o.Schema + ".delivered"
	if _, err := o.Pool.Exec(ctx, "CREATE TABLE "+delivered+" (n bigserial, id uuid NOT NULL, key text NOT NULL, relay text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// start starts a relay process and returns once it runs its relay.
	start := func(name string) *exec.Cmd {
		c := exec.Command(exe)
		c.Env = append(os.Environ(), childSchema+"="+o.Schema, childURL+"="+srv.URL(), childName+"="+name)
		c.Stderr = os.Stderr
		out, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "running\n" {
			t.Fatalf("relay process %s: %q, %v", name, line, err)
		}
		return c
	}
	count := func(where string) (n int) {
		err := o.Pool.QueryRow(ctx, "SELECT count(*) FROM "+delivered+" "+where).Scan(&n)
		if err != nil {
			return -1 // the server is down
		}
		return n
	}

	// Producers: one event per transaction, 10 keys, recording what committed, in commit
	// order per key (a key's events come from one goroutine).
	var (
		mu        sync.Mutex
		committed = map[string][]uuid.UUID{}
		total     atomic.Int64
	)
	pctx, stopProducers := context.WithCancel(ctx)
	var producers sync.WaitGroup
	for p := range 2 {
		producers.Go(func() {
			for i := 0; pctx.Err() == nil; i++ {
				key := fmt.Sprintf("key-%d", p*5+i%5)
				e := outbox.New(note{N: i}, outbox.WithKey(key))
				err := pgx.BeginFunc(pctx, o.Pool, func(tx pgx.Tx) error { return o.Publish(pctx, tx, e) })
				if err != nil {
					time.Sleep(20 * time.Millisecond) // the server is down: a commit that failed is not counted
					continue
				}
				mu.Lock()
				committed[key] = append(committed[key], e.ID)
				mu.Unlock()
				total.Add(1)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}

	first := start("first")
	outboxtest.WaitFor(t, 30*time.Second, "the first relay to deliver", func() bool { return count("WHERE relay = 'first'") >= 200 })
	second := start("second") // a standby: the first holds the slot
	if n := count("WHERE relay = 'second'"); n != 0 {
		t.Fatalf("the standby delivered %d events while the reader lived", n)
	}
	if err := first.Process.Kill(); err != nil { // SIGKILL: no deferred code, no write-back
		t.Fatal(err)
	}
	killed := time.Now()
	_ = first.Wait()
	outboxtest.WaitFor(t, 30*time.Second, "the standby to take over", func() bool { return count("WHERE relay = 'second'") > 0 })
	t.Logf("the standby delivered its first event %v after the reader was killed", time.Since(killed).Round(time.Millisecond))

	before := count("")
	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 60*time.Second, "deliveries to resume after the crash", func() bool { return count("") > before+100 })
	stopProducers()
	producers.Wait()
	mu.Lock()
	var all []uuid.UUID
	for _, ids := range committed {
		all = append(all, ids...)
	}
	mu.Unlock()
	outboxtest.WaitFor(t, 60*time.Second, "every committed event to be delivered", func() bool {
		var missing int
		err := o.Pool.QueryRow(ctx, "SELECT count(*) FROM unnest($1::uuid[]) AS c(id) WHERE NOT EXISTS (SELECT FROM "+delivered+" d WHERE d.id = c.id)", all).Scan(&missing)
		return err == nil && missing == 0
	})
	_ = second.Process.Kill()

	// First deliveries, in delivery order, against each key's commit order.
	rows, err := o.Pool.Query(ctx, "SELECT id, key FROM "+delivered+" ORDER BY n")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uuid.UUID]bool{}
	next := map[string]int{}
	pos := map[uuid.UUID]int{}
	for _, ids := range committed {
		for i, id := range ids {
			pos[id] = i
		}
	}
	var duplicates int
	for rows.Next() {
		var id uuid.UUID
		var key string
		if err := rows.Scan(&id, &key); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			duplicates++
			continue
		}
		seen[id] = true
		p, ok := pos[id]
		if !ok {
			continue // committed while the server crashed, unbeknown to the producer
		}
		if p < next[key] {
			t.Fatalf("key %s: event %d of its commit order delivered after event %d", key, p, next[key]-1)
		}
		next[key] = p + 1
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range pos {
		if !seen[id] {
			t.Fatalf("committed event %s was never delivered", id)
		}
	}
	t.Logf("%d committed events all delivered in key order; %d duplicate deliveries (the killed batch, the crash)", total.Load(), duplicates)
}

// TestLostSlotFallsBackToPolling invalidates the slot while no relay reads it (a server
// that keeps at most max_slot_wal_keep_size of WAL for it), then drops it under a running
// relay: each time the store polls the table, loses nothing, creates the slot again and
// streams.
func TestLostSlotFallsBackToPolling(t *testing.T) {
	outboxtest.SkipIfShort(t, "starts a server and writes 100 MB of WAL")
	srv := pgxtest.StartServer(t, append(pgxtest.LogicalSettings, "max_slot_wal_keep_size=32MB", "max_wal_size=64MB")...)
	o := newLogOutboxStopped(t, srv)
	ctx := context.Background()
	slotState := func() outboxdriverSlot {
		st, err := outboxpglog.ReadSlot(ctx, o.Pool, o.slot())
		if err != nil {
			t.Fatal(err)
		}
		return outboxdriverSlot{st.Exists, st.Active, st.WALStatus}
	}

	// A first run creates the slot; then the relay stops and events wait.
	q := newRecorder()
	run := o.runRelay(t, q)
	waitMode(t, o.store, "stream")
	run.stop()
	if s := slotState(); !s.exists || s.active {
		t.Fatalf("after the relay stopped, the slot is %+v, want it to exist, inactive", s)
	}
	published := o.publish(t, 50)
	// 100 MB of WAL with checkpoints: the slot falls behind its keep size and is lost.
	if _, err := o.Pool.Exec(ctx, "CREATE TABLE "+o.Schema+".junk (b text)"); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 120*time.Second, "the server to invalidate the slot", func() bool {
		if _, err := o.Pool.Exec(ctx, "INSERT INTO "+o.Schema+".junk SELECT repeat('x', 1000) FROM generate_series(1, 20000)"); err != nil {
			t.Fatal(err)
		}
		if _, err := o.Pool.Exec(ctx, "SELECT pg_switch_wal(); CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		return slotState().walStatus == "lost"
	})

	run = o.runRelay(t, q)
	defer run.stop()
	outboxtest.WaitFor(t, 30*time.Second, "the events published before the slot was lost", func() bool { return q.has(published) })
	waitMode(t, o.store, "stream")
	if s := slotState(); s.walStatus == "lost" {
		t.Fatal("the relay streams from a lost slot")
	}

	// Dropped under a running relay: terminate its walsender, drop the slot before it
	// reconnects.
	outboxtest.WaitFor(t, 30*time.Second, "the slot to be dropped under the relay", func() bool {
		_, err := o.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL;
`, o.slot())
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.Pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", o.slot())
		return err == nil
	})
	more := o.publish(t, 50)
	outboxtest.WaitFor(t, 30*time.Second, "the events published while the slot was gone", func() bool { return q.has(more) })
	waitMode(t, o.store, "stream")
	last := o.publish(t, 50)
	outboxtest.WaitFor(t, 30*time.Second, "the events published once it streams again", func() bool { return q.has(last) })
}

type outboxdriverSlot struct {
	exists, active bool
	walStatus      string
}

// TestFarBehindSlotIsCreatedAgain starts a relay on a slot 4 MB behind, with a backlog of
// 1,000 events: it polls the backlog with the stream closed, creates the slot again at the
// server's position instead of decoding the WAL, and streams.
func TestFarBehindSlotIsCreatedAgain(t *testing.T) {
	outboxtest.SkipIfShort(t, "starts a server")
	srv := startServer(t)
	o := newLogOutboxStopped(t, srv)
	ctx := context.Background()
	var logs logLines
	cfg := *o.cfg
	cfg.MaxSlotLag = 1 << 20
	cfg.MaxBuffered = 200
	cfg.Logger = logs.logger()
	store, err := outboxpglog.NewStore(o.Pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	o.store = store
	lag := func() int64 {
		st, err := outboxpglog.ReadSlot(ctx, o.Pool, o.slot())
		if err != nil {
			t.Fatal(err)
		}
		return st.Lag
	}

	// A first run creates the slot; the relay stops while events and 4 MB of other WAL
	// are written.
	q := newRecorder()
	run := o.runRelay(t, q)
	waitMode(t, o.store, "stream")
	run.stop()
	published := o.publish(t, 1000)
	for _, sql := range []string{
		"CREATE TABLE " + o.Schema + ".junk (b text)",
		"INSERT INTO " + o.Schema + ".junk SELECT repeat('x', 1000) FROM generate_series(1, 4000)",
	} {
		if _, err := o.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if l := lag(); l <= cfg.MaxSlotLag {
		t.Fatalf("the slot is %d bytes behind, want more than %d", l, cfg.MaxSlotLag)
	}

	// The next run skips that WAL: a new slot, the events read from the table.
	run = o.runRelay(t, q)
	defer run.stop()
	outboxtest.WaitFor(t, 30*time.Second, "the events published while the relay was stopped", func() bool { return q.has(published) })
	waitMode(t, o.store, "stream")
	if l := lag(); l > cfg.MaxSlotLag {
		t.Errorf("the slot is still %d bytes behind", l)
	}
	shown, _, _ := logs.since(0)
	for _, want := range []string{"closes the stream and drops its slot while it polls a backlog", "creating it again"} {
		if !slices.ContainsFunc(shown, func(l string) bool { return strings.Contains(l, want) }) {
			t.Errorf("no log says %q; logs:\n%s", want, strings.Join(shown, "\n"))
		}
	}
	more := o.publish(t, 50)
	outboxtest.WaitFor(t, 30*time.Second, "the events published once it streams", func() bool { return q.has(more) })
}
