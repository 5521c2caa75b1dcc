package outboxpgx_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
)

type recordingSender struct {
	hold sync.RWMutex // locked: sends wait
	mu   sync.Mutex
	sent []outbox.Message
}

func (s *recordingSender) Send(_ context.Context, msgs []outbox.Message) error {
	s.hold.RLock()
	s.hold.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, msgs...)
	return nil
}

func (s *recordingSender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

// ackStore records the events whose Complete the server acknowledged, and the epoch
// (crashes begun so far) it did in. The relay's claims and completes commit with
// synchronous_commit=off, so a crash may undo them, which must only cause re-sends: an
// event claimed again in a later epoch had its acknowledged Complete undone by a crash.
type ackStore struct {
	outboxdriver.Store
	epoch *atomic.Int32
	quiet atomic.Bool // the producers are quiet: no synchronous commit flushes the WAL

	mu      sync.Mutex
	ids     map[int64]uuid.UUID // seq → event ID, from claims
	acked   map[uuid.UUID]int32 // the epoch of the first acknowledged Complete
	nAcked  int                 // Complete calls acknowledged
	nQuiet  int                 // of which begun while the producers were quiet
	nFailed int                 // store calls that failed
	undone  map[uuid.UUID]bool  // acknowledged Complete undone by a crash
}

func (s *ackStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	c, err := s.Store.Claim(ctx, p)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.nFailed++
	}
	epoch := s.epoch.Load()
	for _, m := range c {
		s.ids[m.Seq] = m.Message.ID
		if e, ok := s.acked[m.Message.ID]; ok && e < epoch {
			s.undone[m.Message.ID] = true
		}
	}
	return c, err
}

func (s *ackStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	quiet := s.quiet.Load()
	err := s.Store.Complete(ctx, token, seqs)
	epoch := s.epoch.Load() // read after the server answered
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.nFailed++
		return err
	}
	s.nAcked++
	if quiet {
		s.nQuiet++
	}
	for _, seq := range seqs {
		if id := s.ids[seq]; id != uuid.Nil {
			if _, ok := s.acked[id]; !ok {
				s.acked[id] = epoch
			}
		}
	}
	return nil
}

func (s *ackStore) undoneCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.undone)
}

func (s *ackStore) quietAcks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nQuiet
}

// ledger is what the producers know about their transactions.
type ledger struct {
	mu         sync.Mutex
	committed  []outbox.Encodable // Commit returned nil; per producer in commit order
	rolledBack map[uuid.UUID]bool // rolled back, or failed before Commit: never committed
	unknown    map[uuid.UUID]bool // Commit returned an error: may or may not have committed
	txErrors   int
}

// TestPostgresCrashRestartLosesNothing crashes a real PostgreSQL server (immediate stop: no
// checkpoint, WAL recovery at the next start) and restarts it while producers commit and a
// relay delivers. Afterwards every committed event has been delivered at least once, no
// event that never committed was, and nothing was dead-lettered.
//
// The first crash comes while the producers are quiet, right after the relay completed
// batches: the relay's claims and completes skip the WAL flush (synchronous_commit=off) and
// no producer's synchronous commit has flushed them since, so the crash usually undoes some
// of them, which must only cause re-sends. It is a crash of the server, not of the machine:
// WAL the server wrote but did not fsync survives it, so the WAL writer sometimes saves
// them; the quiet crash is then repeated, up to three times. The last crash comes while the
// producers are busy, to catch commits in flight.
func TestPostgresCrashRestartLosesNothing(t *testing.T) {
	began := time.Now()
	srv := pgxtest.StartServer(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // before the server stops (cleanups run last-in first-out)
	o, err := outboxpgx.New(outbox.Tables{Schema: "crash"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA crash"); err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	setup := time.Since(began)

	var epoch atomic.Int32 // how many crashes have started
	sender := &recordingSender{}
	store := &ackStore{Store: mustStore(t, o, pool), epoch: &epoch, ids: map[int64]uuid.UUID{},
		acked: map[uuid.UUID]int32{}, undone: map[uuid.UUID]bool{}}
	// Lease 1s (the minimum): leases taken before a crash expire soon after the restart.
	// MaxAttempts stays at its default: failed store calls count no attempts, and a message
	// is claimed again only after a lost write-back, about once per crash.
	relay, err := relay.New(store, sender, &relay.Config{
		Name: "crash", BatchSize: 50, Lease: time.Second, MaxPollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), // its errors while the server is down are expected
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	relayStopped := false
	stopTheRelay := func() {
		if !relayStopped {
			relayStopped = true
			stopRelay()
			if err := <-relayDone; err != nil {
				t.Error(err)
			}
		}
	}
	defer stopTheRelay()

	// Producers: small transactions of 1–3 events, every fourth rolled back; each producer
	// has keys of its own, so a key's commit order is its producer's order. A producer
	// holds the gate's read lock during each transaction: locking it makes them quiet.
	led := &ledger{rolledBack: map[uuid.UUID]bool{}, unknown: map[uuid.UUID]bool{}}
	var stopProducers atomic.Bool
	var gate sync.RWMutex
	var producers sync.WaitGroup
	var commits atomic.Int64
	for p := range 2 {
		producers.Go(func() {
			for i := 0; !stopProducers.Load(); i++ {
				gate.RLock()
				ok := produceOne(ctx, pool, o, led, p, i)
				gate.RUnlock()
				if ok {
					commits.Add(1)
				} else {
					time.Sleep(5 * time.Millisecond) // the server is down: retry without spinning
				}
			}
		})
	}
	producersStopped := false
	stopTheProducers := func() {
		if !producersStopped {
			producersStopped = true
			stopProducers.Store(true)
			producers.Wait()
		}
	}
	defer stopTheProducers()

	var stats []string
	crashAndRestart := func(quiet bool) {
		n := epoch.Load() + 1
		want := sender.count() + 300
		outboxtest.WaitFor(t, 15*time.Second, fmt.Sprintf("%d deliveries before crash %d", want, n),
			func() bool { return sender.count() >= want })
		crashTook := func() time.Duration {
			if quiet {
				// Hold the broker while the producers build a backlog, silence them, then
				// let the relay complete batches: the WAL of those completes is written
				// after the producers' last synchronous commit flushed it. (Deferred
				// unlocks: a failure here must not leave the producers or relay stuck.)
				sender.hold.Lock()
				held := true
				defer func() {
					if held {
						sender.hold.Unlock()
					}
				}()
				c := commits.Load() + 30
				outboxtest.WaitFor(t, 10*time.Second, "a backlog of 30 commits", func() bool { return commits.Load() >= c })
				gate.Lock()
				defer gate.Unlock() // after the crash: the producers try on while the server is down
				store.quiet.Store(true)
				defer store.quiet.Store(false)
				acks := store.quietAcks()
				sender.hold.Unlock()
				held = false
				outboxtest.WaitFor(t, 10*time.Second, "the relay to complete two batches after the producers went quiet",
					func() bool { return store.quietAcks() >= acks+2 })
			}
			epoch.Add(1)
			start := time.Now()
			if err := srv.Crash(); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}()
		time.Sleep(500 * time.Millisecond) // the outage
		restartStart := time.Now()
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		restartTook := time.Since(restartStart)
		c := commits.Load() + 20
		outboxtest.WaitFor(t, 15*time.Second, fmt.Sprintf("20 commits after restart %d", n),
			func() bool { return commits.Load() >= c })
		stats = append(stats, fmt.Sprintf("crash %d (producers quiet: %v) took %v, restart with recovery %v",
			n, quiet, crashTook.Round(time.Millisecond), restartTook.Round(time.Millisecond)))
	}
	undoneSeen := false
	for range 3 {
		crashAndRestart(true)
		// An undone Complete shows when its events are claimed again: at once, or when
		// the lease of a claim that survived expires (1s), or after the relay's back-off.
		for deadline := time.Now().Add(3 * time.Second); !undoneSeen && time.Now().Before(deadline); {
			undoneSeen = store.undoneCount() > 0
			time.Sleep(5 * time.Millisecond)
		}
		if undoneSeen {
			break
		}
	}
	if !undoneSeen {
		t.Log("NOTE: no crash undid an acknowledged Complete of the relay; synchronous_commit=off went unexercised this run")
	}
	crashAndRestart(false)
	stopTheProducers()

	drainStart := time.Now()
	outboxtest.WaitFor(t, 20*time.Second, "the relay to drain the outbox after the restarts", func() bool {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM crash.outbox").Scan(&n)
		return err == nil && n == 0
	})
	drainTook := time.Since(drainStart)
	stopTheRelay()

	delivered := map[uuid.UUID]int{}
	for _, m := range sender.sent {
		delivered[m.ID]++
	}
	surely := map[uuid.UUID]bool{}
	var lost []uuid.UUID
	for _, e := range led.committed {
		m, _ := e.Encode()
		surely[m.ID] = true
		if delivered[m.ID] == 0 {
			lost = append(lost, m.ID)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d committed events were never delivered: %v", len(lost), len(led.committed), lost)
	}
	var ghosts []uuid.UUID
	for id := range led.rolledBack {
		if delivered[id] > 0 {
			ghosts = append(ghosts, id)
		}
	}
	if len(ghosts) > 0 {
		t.Errorf("%d events that never committed were delivered: %v", len(ghosts), ghosts)
	}
	dlt, err := o.NewDeadLetters(pool)
	if err != nil {
		t.Fatal(err)
	}
	dl, err := dlt.List(ctx, deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dl) > 0 {
		t.Errorf("%d events were dead-lettered, the first: %+v", len(dl), dl[0])
	}
	// Per key, first deliveries follow commit order (events of unknown outcome left out).
	var sentCommitted []outbox.Message
	for _, m := range sender.sent {
		if surely[m.ID] {
			sentCommitted = append(sentCommitted, m)
		}
	}
	outboxtest.CheckPerKeyOrder(t, led.committed, sentCommitted)
	log, _ := os.ReadFile(srv.LogFile())
	if n := strings.Count(string(log), "automatic recovery in progress"); n != int(epoch.Load()) {
		t.Errorf("the server log shows %d crash recoveries, want %d", n, epoch.Load())
	}

	unknownDelivered := 0
	for id := range led.unknown {
		if delivered[id] > 0 {
			unknownDelivered++
		}
	}
	t.Logf("%d events committed, %d never committed (rolled back or failed before COMMIT), %d of unknown outcome "+
		"(COMMIT failed; %d of them delivered); %d deliveries, %d re-sends; %d events whose Complete the server "+
		"acknowledged were undone by a crash and re-sent; %d failed transactions, %d failed relay store calls",
		len(led.committed), len(led.rolledBack), len(led.unknown), unknownDelivered,
		len(sender.sent), len(sender.sent)-len(delivered), len(store.undone), led.txErrors, store.nFailed)
	t.Logf("setup %v; %s; drain %v; total %v", setup.Round(time.Millisecond), strings.Join(stats, "; "),
		drainTook.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// produceOne runs producer p's i-th transaction and records its outcome in led. It
// returns false if the transaction failed.
func produceOne(ctx context.Context, pool *pgxpool.Pool, o *outboxpgx.Outbox, led *ledger, p, i int) bool {
	events := make([]outbox.Encodable, 1+i%3)
	ids := make([]uuid.UUID, len(events))
	for j := range events {
		key := ""
		if (i+j)%2 == 0 {
			key = fmt.Sprintf("p%d-k%d", p, (i+j)%7)
		}
		e := outbox.New(outboxtestNote{N: i}, outbox.WithKey(key))
		events[j], ids[j] = e, e.ID
	}
	record := func(set map[uuid.UUID]bool) {
		for _, id := range ids {
			set[id] = true
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		led.mu.Lock()
		led.txErrors++
		led.mu.Unlock()
		return false
	}
	if err := o.Publish(ctx, tx, events...); err != nil {
		_ = tx.Rollback(ctx)
		led.mu.Lock()
		led.txErrors++
		record(led.rolledBack) // no COMMIT was sent: it cannot have committed
		led.mu.Unlock()
		return false
	}
	if i%4 == 3 {
		_ = tx.Rollback(ctx) // even if this fails, no COMMIT was sent
		led.mu.Lock()
		record(led.rolledBack)
		led.mu.Unlock()
		return true
	}
	err = tx.Commit(ctx)
	led.mu.Lock()
	defer led.mu.Unlock()
	if err != nil {
		led.txErrors++
		record(led.unknown)
		return false
	}
	led.committed = append(led.committed, events...)
	return true
}

// mustStore is o's relay store over db, failing t on an error.
func mustStore(t testing.TB, o *outboxpgx.Outbox, db outboxpgx.DB) outboxdriver.Store {
	t.Helper()
	s, err := o.NewStore(db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
