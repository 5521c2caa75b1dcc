package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// StoreFixture is one fresh, empty outbox of the adapter under test.
type StoreFixture struct {
	// Store is the relay's store over the outbox.
	Store outboxdriver.Store
	// Publish writes events through the adapter's Publish in one transaction of the
	// adapter's own kind, then commits it, or rolls it back when commit is false. It returns
	// Publish's error (after rolling back).
	Publish func(ctx context.Context, commit bool, events ...outbox.Encodable) error
	// Pending counts the messages in the outbox table.
	Pending func(ctx context.Context) (int, error)
	// DeadLetters reads the dead-letter table.
	DeadLetters func(ctx context.Context) ([]DeadLetterRow, error)
	// SingleRelay says the database supports one relay at a time (SQLite); multi-relay
	// tests then run one.
	SingleRelay bool
	// Cancel calls the adapter's Cancel (of a scheduled event) in one transaction of the
	// adapter's own kind, then commits it, or rolls it back when commit is false. nil skips
	// the scheduled-event tests (a store without scheduling).
	Cancel func(ctx context.Context, commit bool, id uuid.UUID) (bool, error)
	// PublishNilTx calls the adapter's Publish with a typed-nil transaction of its kind (a
	// nil *sql.Tx in an interface, a nil pgx.Tx…); it must fail, not panic.
	PublishNilTx func(ctx context.Context, events ...outbox.Encodable) error
	// DeadLetterTable is the outbox's dead-letter table.
	DeadLetterTable deadletter.Table
	// SQL spoils rows as a producer that bypasses Publish would; nil skips those tests.
	SQL *RawSQL
	// Unmigrate drops the outbox's tables, functions and schema, as if it had never been
	// migrated: Store, Publish and DeadLetterTable must then fail with errors wrapping
	// outbox.ErrSchema. nil skips that test.
	Unmigrate func(ctx context.Context) error
}

// DeadLetterRow is what the suite checks of a dead letter.
type DeadLetterRow struct {
	EventID  uuid.UUID
	Stage    string
	Reason   string
	Attempts int
}

// Note is the payload the suite publishes.
type Note struct {
	Text string `json:"text"`
	N    int    `json:"n"`
}

// EventType implements outbox.Payload.
func (Note) EventType() string { return "outboxtest.note" }

// Poison is a payload type whose sends the suite makes fail.
type Poison struct{ N int }

// EventType implements outbox.Payload.
func (Poison) EventType() string { return "outboxtest.poison" }

type unencodable struct{ C chan int }

func (unencodable) EventType() string { return "outboxtest.unencodable" }

// fastRelay is a relay config for tests: quick retries, short polls.
func fastRelay(name string, maxAttempts int) *relay.Config {
	return &relay.Config{
		Name:            name,
		BatchSize:       50,
		MaxAttempts:     maxAttempts,
		Lease:           2 * time.Second,
		SendTimeout:     time.Second,
		MinPollInterval: time.Millisecond,
		MaxPollInterval: 20 * time.Millisecond,
		RetryBackoff:    time.Millisecond,
		MaxRetryBackoff: 5 * time.Millisecond,
	}
}

// relays is how many relays the multi-relay tests run on f: 3, or 1 where the database
// takes one at a time.
func (f *StoreFixture) relays() int {
	if f.SingleRelay {
		return 1
	}
	return 3
}

// skipKey sets cfg's KeyPolicy to SkipKey and returns it.
func skipKey(cfg *relay.Config) *relay.Config {
	cfg.KeyPolicy = relay.SkipKey
	return cfg
}

// ExerciseStore runs the relay-store conformance suite. newFixture is called once per
// subtest and must return an empty outbox. Besides delivery, order, leases and poison, it
// holds a store to the contract of DeadLetter.HoldKey (with DeadLetterTable's Replay and
// Discard), Claimed.FirstFailedAt, outboxdriver.Validator and outbox.ErrSchema (with Unmigrate),
// and outbox.Unavailable for a dropped connection (with RawSQL.Lock).
func ExerciseStore(t *testing.T, newFixture func(t *testing.T) *StoreFixture) {
	t.Helper()
	ctx := context.Background()

	exercisePoisonStore(t, newFixture)
	exerciseOutage(t, newFixture)
	exerciseHeldKeys(t, newFixture)
	exerciseDatabaseFaults(t, newFixture)
	exerciseScheduled(t, newFixture)

	t.Run("CommitIsDelivered", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		events := []outbox.Event[Note]{
			outbox.New(Note{"a", 1}, outbox.WithKey("k1"), outbox.WithHeader("tenant", "acme")),
			outbox.New(Note{"b", 2}),
		}
		mustPublish(t, f, true, encodables(events)...)
		q := outboxmemory.New(nil)
		drain(t, f.Store, q, 2)
		sent := q.Sent()
		for i, e := range events {
			want, _ := e.Encode()
			if err := SameMessage(sent[i], want); err != nil {
				t.Error(err)
			}
		}
		expectPending(t, f, 0)
	})

	t.Run("RollbackIsNeverDelivered", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		rolled := outbox.New(Note{Text: "rolled back"})
		mustPublish(t, f, false, rolled)
		kept := outbox.New(Note{Text: "committed"})
		mustPublish(t, f, true, kept)
		q := outboxmemory.New(nil)
		drain(t, f.Store, q, 1)
		for _, m := range q.Sent() {
			if m.ID == rolled.ID {
				t.Fatal("a rolled-back event was delivered")
			}
		}
		expectPending(t, f, 0)
	})

	t.Run("ManyEventsInOneTransaction", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		var events []outbox.Encodable
		want := map[uuid.UUID]bool{}
		for i := range 250 {
			e := outbox.New(Note{N: i})
			events = append(events, e)
			want[e.ID] = true
		}
		mustPublish(t, f, true, events...)
		q := outboxmemory.New(nil)
		drain(t, f.Store, q, len(events))
		for _, m := range q.Sent() {
			delete(want, m.ID)
		}
		if len(want) > 0 {
			t.Fatalf("%d events not delivered", len(want))
		}
	})

	// Claims of keyless events need no order, so they may run at once (PostgreSQL's do,
	// without the claims' lock): each row must still go to one claim only.
	t.Run("ConcurrentKeylessClaimsNeverOverlap", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if f.SingleRelay {
			t.Skip("one relay at a time")
		}
		const n, claimers = 600, 4
		events := make([]outbox.Encodable, n)
		for i := range events {
			events[i] = outbox.New(Note{N: i})
		}
		mustPublish(t, f, true, events...)
		var (
			mu    sync.Mutex
			owner = map[int64]int64{} // seq → the token of the claim that took it
			errs  []error
			wg    sync.WaitGroup
		)
		for c := range claimers {
			wg.Go(func() {
				for round := int64(0); ; round++ {
					token := int64(c+1)<<32 | round
					got, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: fmt.Sprint("claimer-", c), Token: token, Limit: 25, Lease: time.Minute})
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					}
					for _, g := range got {
						if prev, dup := owner[g.Seq]; dup {
							errs = append(errs, fmt.Errorf("row %d claimed by tokens %d and %d", g.Seq, prev, token))
						}
						owner[g.Seq] = token
					}
					mu.Unlock()
					if err != nil || len(got) == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if len(owner) != n {
			t.Fatalf("%d rows claimed, want %d", len(owner), n)
		}
	})

	// Claims of keyed events from many claimers at once, each the lane of a relay with 1, 2,
	// 3 or 20 loops (PostgreSQL gives each lane a share of the keys of its own): no key is
	// ever in two claims at once, and each claim of a key starts after the last row of the
	// key that an earlier claim took.
	t.Run("ConcurrentKeyedClaimsNeverShareAKey", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if f.SingleRelay {
			t.Skip("one relay at a time")
		}
		const keys, perKey = 24, 40
		var events []outbox.Encodable
		for i := range perKey {
			for k := range keys {
				events = append(events, outbox.New(Note{N: i}, outbox.WithKey(fmt.Sprintf("k-%d", k))))
			}
			if i%4 == 0 {
				events = append(events, outbox.New(Note{N: i}))
			}
		}
		mustPublish(t, f, true, events...)
		lanes := []struct{ lane, lanes int }{{0, 1}, {0, 2}, {1, 2}, {0, 2}, {1, 2}, {2, 3}, {0, 0}, {17, 20}}
		var (
			mu       sync.Mutex
			inFlight = map[string]int64{} // key → token of the claim holding it
			last     = map[string]int64{} // key → highest seq claimed so far
			done     int
			errs     []error
			wg       sync.WaitGroup
		)
		deadline := time.Now().Add(30 * time.Second)
		for c, l := range lanes {
			wg.Go(func() {
				for round := int64(0); time.Now().Before(deadline); round++ {
					mu.Lock()
					finished := done == len(events) || len(errs) > 0
					mu.Unlock()
					if finished {
						return
					}
					token := int64(c+1)<<32 | round
					got, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{
						Owner: fmt.Sprint("claimer-", c), Token: token, Limit: 20, Lease: time.Minute,
						Lane: l.lane, Lanes: l.lanes,
					})
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					mu.Lock()
					for _, g := range got {
						k := g.Message.Key
						if k == "" {
							continue
						}
						if other, ok := inFlight[k]; ok && other != token {
							errs = append(errs, fmt.Errorf("key %s in claims %d and %d at once", k, other, token))
						}
						if g.Seq <= last[k] {
							errs = append(errs, fmt.Errorf("claim %d took row %d of key %s after row %d", token, g.Seq, k, last[k]))
						}
						inFlight[k], last[k] = token, g.Seq
					}
					mu.Unlock()
					if len(got) == 0 {
						time.Sleep(time.Millisecond) // the other claimers hold the rest
						continue
					}
					// Held while the others claim, then let go of (the keys first: a claim
					// that sees the rows deleted may take the keys' next rows at once).
					time.Sleep(time.Duration(round%3) * time.Millisecond)
					seqs := make([]int64, len(got))
					mu.Lock()
					for i, g := range got {
						seqs[i] = g.Seq
						if inFlight[g.Message.Key] == token {
							delete(inFlight, g.Message.Key)
						}
					}
					done += len(got)
					mu.Unlock()
					if err := f.Store.Complete(ctx, token, seqs); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if done != len(events) {
			t.Fatalf("%d of %d events claimed within 30 s", done, len(events))
		}
		expectPending(t, f, 0)
	})

	t.Run("UnencodablePayloadFailsPublish", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		err := f.Publish(ctx, true, outbox.New(Note{Text: "fine"}), outbox.New(unencodable{C: make(chan int)}))
		var ee *outbox.EncodeError
		if !errors.As(err, &ee) {
			t.Fatalf("Publish error = %v, want an *outbox.EncodeError", err)
		}
		expectPending(t, f, 0)
	})

	t.Run("PerKeyOrderUnderRetriesWithThreeRelays", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		const keys, perKey = 5, 20
		var events []outbox.Encodable
		for i := range perKey {
			for k := range keys {
				events = append(events, outbox.New(Note{N: i}, outbox.WithKey(fmt.Sprintf("key-%d", k))))
			}
		}
		mustPublish(t, f, true, events...)
		q := flakyQueue(3)
		relays := f.relays()
		// Small batches and retries slow enough that other relays claim meanwhile: a store
		// that let a key's later event overtake one waiting for its retry would show here.
		cfg := fastRelay("order", 1000)
		cfg.BatchSize, cfg.RetryBackoff, cfg.MaxRetryBackoff = 7, 20*time.Millisecond, 20*time.Millisecond
		RunRelays(t, f.Store, q, relays, cfg, func() bool { return len(q.Sent()) >= len(events) })
		CheckPerKeyOrder(t, events, q.Sent())
		expectPending(t, f, 0)
	})

	t.Run("PerKeyOrderInADeepBacklogWithThreeRelays", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		// A backlog many batches deep, of few keys and keyless events: claims find most
		// keys' first events in flight or waiting for a retry, and reach keys and keyless
		// events far behind the front of the outbox.
		const keys, perKey = 8, 40
		var events []outbox.Encodable
		for i := range perKey {
			for k := range keys {
				events = append(events, outbox.New(Note{N: i}, outbox.WithKey(fmt.Sprintf("deep-%d", k))))
			}
			if i%2 == 0 {
				events = append(events, outbox.New(Note{N: i}), outbox.New(Note{N: i}), outbox.New(Note{N: i}))
			}
		}
		mustPublish(t, f, true, events...)
		q := flakyQueue(3)
		relays := f.relays()
		cfg := fastRelay("deep", 1000)
		cfg.BatchSize, cfg.RetryBackoff, cfg.MaxRetryBackoff = 8, 20*time.Millisecond, 20*time.Millisecond
		RunRelays(t, f.Store, q, relays, cfg, func() bool { return len(ids(q.Sent())) >= len(events) })
		CheckPerKeyOrder(t, events, q.Sent())
		expectPending(t, f, 0)
	})

	t.Run("FailingKeyBlocksOnlyItself", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		stuck1 := outbox.New(Poison{1}, outbox.WithKey("stuck"))
		stuck2 := outbox.New(Note{N: 2}, outbox.WithKey("stuck"))
		other := outbox.New(Note{N: 3}, outbox.WithKey("other"))
		free := outbox.New(Note{N: 4})
		mustPublish(t, f, true, stuck1, stuck2, other, free)
		q := outboxmemory.New(&outboxmemory.Config{SendHook: failType(Poison{}.EventType())})
		cfg := fastRelay("blocking", 10)
		cfg.RetryBackoff, cfg.MaxRetryBackoff = time.Hour, time.Hour
		r := newRelay(t, f.Store, q, cfg)
		for range 3 {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := ids(q.Sent())
		if !got[other.ID] || !got[free.ID] {
			t.Fatal("other keys' events were held up by a failing key")
		}
		if got[stuck2.ID] {
			t.Fatal("an event was delivered before an earlier event of its key")
		}
		expectPending(t, f, 2)
	})

	t.Run("CrashBetweenSendAndDeleteResends", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		e := outbox.New(Note{Text: "once at least"})
		mustPublish(t, f, true, e)
		q := outboxmemory.New(nil)
		// A relay claims and sends, then dies before writing back.
		claimed, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "crashed", Token: 1, Limit: 10, Lease: 300 * time.Millisecond})
		if err != nil || len(claimed) != 1 {
			t.Fatalf("claim: %d rows, %v", len(claimed), err)
		}
		if err := q.Send(ctx, []outbox.Message{claimed[0].Message}); err != nil {
			t.Fatal(err)
		}
		// Another relay takes over once the lease expires and sends it again.
		r := newRelay(t, f.Store, q, fastRelay("successor", 10))
		WaitFor(t, 10*time.Second, "the successor to re-send the event", func() bool {
			n, err := r.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return n == 1
		})
		sent := q.Sent()
		if len(sent) != 2 || sent[0].ID != e.ID || sent[1].ID != e.ID {
			t.Fatalf("want the event sent twice (one duplicate), got %d sends", len(sent))
		}
		// The crashed relay's late write-back must not touch the successor's work.
		if err := f.Store.Complete(ctx, 1, []int64{claimed[0].Seq}); err != nil {
			t.Fatal(err)
		}
		expectPending(t, f, 0)
	})

	t.Run("ExpiredLeaseIsReclaimedAndFenced", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		mustPublish(t, f, true, outbox.New(Note{Text: "leased"}))
		first, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "a", Token: 11, Limit: 10, Lease: 300 * time.Millisecond})
		if err != nil || len(first) != 1 || first[0].Attempts != 1 {
			t.Fatalf("first claim: %+v, %v", first, err)
		}
		again, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "b", Token: 22, Limit: 10, Lease: time.Minute})
		if err != nil || len(again) != 0 {
			t.Fatalf("a leased message was claimed twice: %d rows, %v", len(again), err)
		}
		var second []outboxdriver.Claimed
		WaitFor(t, 10*time.Second, "the expired lease to be reclaimed", func() bool {
			second, err = f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "b", Token: 22, Limit: 10, Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			return len(second) == 1
		})
		if second[0].Attempts != 2 {
			t.Fatalf("reclaimed message has Attempts %d, want 2", second[0].Attempts)
		}
		// The first owner's stale write-backs change nothing.
		seq := first[0].Seq
		if err := f.Store.Retry(ctx, 11, []outboxdriver.Retry{{Seq: seq, Delay: time.Hour, Error: "stale"}}); err != nil {
			t.Fatal(err)
		}
		if err := f.Store.Release(ctx, 11, []int64{seq}); err != nil {
			t.Fatal(err)
		}
		if moved, err := f.Store.DeadLetter(ctx, 11, []outboxdriver.DeadLetter{{Seq: seq, Reason: "stale"}}); err != nil || len(moved) != 0 {
			t.Fatalf("a stale DeadLetter moved %v (%v), want nothing", moved, err)
		}
		if err := f.Store.Complete(ctx, 11, []int64{seq}); err != nil {
			t.Fatal(err)
		}
		expectPending(t, f, 1)
		if dl := deadLetters(t, f); len(dl) != 0 {
			t.Fatalf("a stale owner dead-lettered a message: %+v", dl)
		}
		if err := f.Store.Complete(ctx, 22, []int64{seq}); err != nil {
			t.Fatal(err)
		}
		expectPending(t, f, 0)
	})

	t.Run("LostLeasesEndInTheDeadLetters", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		e := outbox.New(Note{Text: "crashes the relay"})
		mustPublish(t, f, true, e)
		// Two relays in a row die while sending it: their leases expire with no write-back.
		for token := int64(1); token <= 2; token++ {
			WaitFor(t, 10*time.Second, "the message to be claimable", func() bool {
				c, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "doomed", Token: token, Limit: 1, Lease: 200 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				return len(c) == 1
			})
		}
		q := outboxmemory.New(nil)
		r := newRelay(t, f.Store, q, fastRelay("survivor", 2))
		WaitFor(t, 10*time.Second, "the message to be dead-lettered", func() bool {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			return len(deadLetters(t, f)) == 1
		})
		dl := deadLetters(t, f)[0]
		if dl.EventID != e.ID || dl.Attempts != 3 || !strings.Contains(dl.Reason, "claimed 2 times without an outcome") {
			t.Fatalf("dead letter %+v", dl)
		}
		if len(q.Sent()) != 0 {
			t.Fatal("a message over MaxAttempts was sent again")
		}
	})

	t.Run("ReleaseGivesBackWithoutCountingAnAttempt", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		mustPublish(t, f, true, outbox.New(Note{N: 1}, outbox.WithKey("k")), outbox.New(Note{N: 2}, outbox.WithKey("k")))
		c, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "a", Token: 5, Limit: 10, Lease: time.Minute})
		if err != nil || len(c) != 2 {
			t.Fatalf("claim: %d rows, %v", len(c), err)
		}
		if err := f.Store.Release(ctx, 5, []int64{c[0].Seq, c[1].Seq}); err != nil {
			t.Fatal(err)
		}
		c2, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "b", Token: 6, Limit: 10, Lease: time.Minute})
		if err != nil || len(c2) != 2 || c2[0].Attempts != 1 || c2[0].Seq != c[0].Seq {
			t.Fatalf("after release: %+v, %v", c2, err)
		}
	})

	t.Run("PoisonIsDeadLetteredAfterMaxAttempts", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		poison := outbox.New(Poison{1}, outbox.WithKey("p"))
		after := outbox.New(Note{N: 2}, outbox.WithKey("p"))
		good := outbox.New(Note{N: 3})
		mustPublish(t, f, true, poison, after, good)
		q := outboxmemory.New(&outboxmemory.Config{SendHook: failType(Poison{}.EventType())})
		// SkipKey: the key's later event goes on (HeldKeyWaitsForItsDeadLetter is the
		// default's test).
		RunRelays(t, f.Store, q, 1, skipKey(fastRelay("poison", 3)), func() bool { return len(q.Sent()) == 2 })
		dl := deadLetters(t, f)
		if len(dl) != 1 || dl[0].EventID != poison.ID || dl[0].Attempts != 3 || dl[0].Stage != "relay" ||
			!strings.Contains(dl[0].Reason, "poisoned") {
			t.Fatalf("dead letters: %+v, want the poison event after 3 attempts with its error", dl)
		}
		if got := ids(q.Sent()); !got[good.ID] || !got[after.ID] {
			t.Fatal("the events around the poison one were not delivered")
		}
		expectPending(t, f, 0)
	})

	t.Run("PermanentErrorIsDeadLetteredAtOnce", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		big := outbox.New(Note{Text: strings.Repeat("x", 2048)})
		small := outbox.New(Note{Text: "fits"})
		mustPublish(t, f, true, big, small)
		q := outboxmemory.New(&outboxmemory.Config{MaxMessageBytes: 1024})
		RunRelays(t, f.Store, q, 1, fastRelay("limit", 10), func() bool { return len(deadLetters(t, f)) == 1 && len(q.Sent()) == 1 })
		dl := deadLetters(t, f)
		if dl[0].EventID != big.ID || dl[0].Attempts != 1 || !strings.Contains(dl[0].Reason, "over the limit of 1024") {
			t.Fatalf("dead letter %+v, want the oversize event after 1 attempt naming the limit", dl[0])
		}
	})
}

// RunRelays runs n relays over store until done reports true (checked every few
// milliseconds, up to 30s), then stops them and waits for them to return.
func RunRelays(t testing.TB, store outboxdriver.Store, sender outbox.Sender, n int, cfg *relay.Config, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		c := *cfg
		c.Name = fmt.Sprintf("%s-%d", cfg.Name, i)
		r := newRelay(t, store, sender, &c)
		wg.Go(func() { errs <- r.Run(ctx) })
	}
	defer func() {
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("relay returned %v", err)
			}
		}
	}()
	WaitFor(t, 30*time.Second, "the relays to deliver", done)
}

// CheckPerKeyOrder fails the test unless, for every key, the first delivery of each event
// follows the order in which events were published.
func CheckPerKeyOrder(t testing.TB, published []outbox.Encodable, delivered []outbox.Message) {
	t.Helper()
	pos := map[uuid.UUID]int{}
	for i, e := range published {
		m, _ := e.Encode()
		pos[m.ID] = i
	}
	last := map[string]int{}
	seen := map[uuid.UUID]bool{}
	for _, m := range delivered {
		if m.Key == "" || seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		if p, ok := last[m.Key]; ok && pos[m.ID] < p {
			t.Fatalf("key %s: event %s (published %d) delivered after one published %d", m.Key, m.ID, pos[m.ID], p)
		}
		last[m.Key] = pos[m.ID]
	}
}

// flakyQueue is an in-memory broker on which every n-th send fails.
func flakyQueue(n int) *outboxmemory.Queue {
	var calls atomic.Int64
	return outboxmemory.New(&outboxmemory.Config{SendHook: func(outbox.Message) error {
		if calls.Add(1)%int64(n) == 0 {
			return errors.New("broker hiccup")
		}
		return nil
	}})
}

func newRelay(t testing.TB, store outboxdriver.Store, sender outbox.Sender, cfg *relay.Config) *relay.Relay {
	t.Helper()
	r, err := relay.New(store, sender, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// drain runs one relay until want messages were sent.
func drain(t testing.TB, store outboxdriver.Store, q *outboxmemory.Queue, want int) {
	t.Helper()
	r := newRelay(t, store, q, fastRelay("drain", 10))
	WaitFor(t, 30*time.Second, fmt.Sprintf("%d messages to be delivered", want), func() bool {
		if _, err := r.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return len(q.Sent()) >= want
	})
}

func failType(typ string) func(outbox.Message) error {
	return func(m outbox.Message) error {
		if m.Type == typ {
			return errors.New("poisoned: the broker rejects this event")
		}
		return nil
	}
}

func mustPublish(t testing.TB, f *StoreFixture, commit bool, events ...outbox.Encodable) {
	t.Helper()
	if err := f.Publish(context.Background(), commit, events...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

func expectPending(t testing.TB, f *StoreFixture, want int) {
	t.Helper()
	n, err := f.Pending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("%d messages left in the outbox, want %d", n, want)
	}
}

func deadLetters(t testing.TB, f *StoreFixture) []DeadLetterRow {
	t.Helper()
	dl, err := f.DeadLetters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dl
}

func encodables[T outbox.Payload](events []outbox.Event[T]) []outbox.Encodable {
	out := make([]outbox.Encodable, len(events))
	for i, e := range events {
		out[i] = e
	}
	return out
}

func ids(msgs []outbox.Message) map[uuid.UUID]bool {
	out := map[uuid.UUID]bool{}
	for _, m := range msgs {
		out[m.ID] = true
	}
	return out
}

// WaitFor polls cond every few milliseconds until it holds, failing t (naming what it
// waited for) after timeout. Tests wait for conditions with it instead of sleeping.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
