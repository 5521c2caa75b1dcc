package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// IdempotencyFixture is one fresh outbox (with its inbox and dead-letter table) of the
// adapter under test, whose transactions are of type TTx, and the adapter's idempotency
// verbs over it (through the adapter's default Outbox where the outbox has the default
// table names).
type IdempotencyFixture[TTx any] struct {
	// Store is the relay store of the outbox (replayed dead letters come back through it).
	Store outboxdriver.Store
	// DeadLetters is the adapter's NewDeadLetters.
	DeadLetters deadletter.Table
	// Inbox is the adapter's NewInbox.
	Inbox idempotency.Inbox[TTx]

	// Effect inserts, inside tx, one row (id, text) into an effects table that has no unique
	// key, so that a duplicate effect would show.
	Effect func(ctx context.Context, tx TTx, id, text string) error
	// Effects counts the effect rows by text.
	Effects func(ctx context.Context) (map[string]int, error)
	// Publish writes events inside tx through the adapter's Publish.
	Publish func(ctx context.Context, tx TTx, events ...outbox.Encodable) error
	// Pending counts the messages in the outbox table.
	Pending func(ctx context.Context) (int, error)
	// AgeInbox moves the recording time of every inbox row and stored response d into the
	// past.
	AgeInbox func(ctx context.Context, d time.Duration) error

	// Idempotent is the adapter's Idempotent around h, with cfg.
	Idempotent func(h idempotency.TxHandler[TTx, Note], cfg *idempotency.GroupConfig) consumer.Handler[Note]
	// SkipSeen is the adapter's SkipSeen around h.
	SkipSeen func(h consumer.Handler[Note]) consumer.Handler[Note]
	// IdempotentHTTP is the adapter's IdempotentHTTP around h.
	IdempotentHTTP func(h idempotency.HTTPTxHandler[TTx], cfg *idempotency.HTTPConfig) http.Handler
	// PruneInbox is the adapter's PruneInbox.
	PruneInbox func(ctx context.Context, retention time.Duration, limit int) (int64, error)
	// SQL reaches the tables with raw SQL; the poison tests check the dialect's column
	// limits by its Dialect.
	SQL *RawSQL
	// Unmigrate drops the outbox's tables (see StoreFixture.Unmigrate); nil skips that test.
	Unmigrate func(ctx context.Context) error
}

// oneEventPerTransaction turns the adapters' Idempotent's group commit off.
var oneEventPerTransaction = &idempotency.GroupConfig{MaxEvents: 1}

// idemMode is one configuration of the adapter's Idempotent, as the consumer-driven cases use it.
type idemMode[TTx any] struct {
	name string
	wrap func(f *IdempotencyFixture[TTx], h idempotency.TxHandler[TTx, Note]) consumer.Handler[Note]
}

// ExerciseIdempotency runs the exactly-once, group-commit, HTTP Idempotency-Key and
// dead-letter suite for an adapter's idempotency verbs and tables. newFixture is called once
// per subtest and must return an empty outbox.
func ExerciseIdempotency[TTx any](t *testing.T, newFixture func(t *testing.T) *IdempotencyFixture[TTx]) {
	t.Helper()
	modes := []idemMode[TTx]{
		{"Idempotent", func(f *IdempotencyFixture[TTx], h idempotency.TxHandler[TTx, Note]) consumer.Handler[Note] {
			return f.Idempotent(h, nil)
		}},
		{"IdempotentOneEventPerTransaction", func(f *IdempotencyFixture[TTx], h idempotency.TxHandler[TTx, Note]) consumer.Handler[Note] {
			return f.Idempotent(h, oneEventPerTransaction)
		}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			exerciseExactlyOnce(t, newFixture, m)
		})
	}
	t.Run("GroupCommit", func(t *testing.T) {
		t.Parallel()
		exerciseGroupCommit(t, newFixture)
	})
	exercisePoisonConsumer(t, newFixture)
	exerciseInboxOutages(t, newFixture)
	t.Run("DeadLetterListReplayDiscard", func(t *testing.T) {
		t.Parallel()
		deadLetterListReplayDiscard(t, newFixture(t))
	})
	t.Run("KeyHold", func(t *testing.T) {
		t.Parallel()
		keyHold(t, newFixture(t))
	})
	t.Run("NeedsConsumerName", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		h := func(ctx context.Context, tx TTx, e outbox.Event[Note]) error { return nil }
		for name, handler := range map[string]consumer.Handler[Note]{
			"Idempotent":                       f.Idempotent(h, nil),
			"IdempotentOneEventPerTransaction": f.Idempotent(h, oneEventPerTransaction),
			"SkipSeen":                         f.SkipSeen(func(context.Context, outbox.Event[Note]) error { return nil }),
		} {
			if err := handler(context.Background(), outbox.New(Note{})); err == nil || !outbox.IsPermanent(err) {
				t.Errorf("%s without a consumer name: %v, want a permanent error", name, err)
			}
		}
	})
	t.Run("SkipSeen", func(t *testing.T) {
		t.Parallel()
		skipSeen(t, newFixture(t))
	})
	t.Run("RecordInTheCallersTransaction", func(t *testing.T) {
		t.Parallel()
		recordInTheCallersTransaction(t, newFixture(t))
	})
	t.Run("PruneInbox", func(t *testing.T) {
		t.Parallel()
		pruneInbox(t, newFixture(t))
	})
	t.Run("IdempotentHTTP", func(t *testing.T) {
		t.Parallel()
		exerciseHTTP(t, newFixture)
	})
}

// effectOf is the usual handler of the suite: one effect row naming the event (its text,
// or its N when the text is empty), then fail(e).
func effectOf[TTx any](f *IdempotencyFixture[TTx], fail func(outbox.Event[Note]) error) idempotency.TxHandler[TTx, Note] {
	return func(ctx context.Context, tx TTx, e outbox.Event[Note]) error {
		if err := f.Effect(ctx, tx, e.ID.String(), noteText(e.Payload)); err != nil {
			return err
		}
		return fail(e)
	}
}

func noteText(n Note) string {
	if n.Text != "" {
		return n.Text
	}
	return strconv.Itoa(n.N)
}

var succeed = func(outbox.Event[Note]) error { return nil }

// exerciseExactlyOnce runs the consumer-driven exactly-once cases through one wrapper.
func exerciseExactlyOnce[TTx any](t *testing.T, newFixture func(t *testing.T) *IdempotencyFixture[TTx], m idemMode[TTx]) {
	ctx := context.Background()
	t.Run("FiveDeliveriesOneEffect", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmemory.New(nil)
		msg, _ := outbox.New(Note{Text: "pay"}).Encode()
		for range 5 { // the broker delivers the same event five times
			if err := q.Send(ctx, []outbox.Message{msg}); err != nil {
				t.Fatal(err)
			}
		}
		runConsumer(t, f.DeadLetters, q, m.wrap(f, effectOf(f, succeed)), 5, func() bool { return q.Len() == 0 })
		expectEffects(t, f, map[string]int{"pay": 1})
	})

	t.Run("CrashBetweenCommitAndAck", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmemory.New(&outboxmemory.Config{VisibilityTimeout: 200 * time.Millisecond})
		msg, _ := outbox.New(Note{Text: "ship"}).Encode()
		if err := q.Send(ctx, []outbox.Message{msg}); err != nil {
			t.Fatal(err)
		}
		// The first delivery's ack is lost, as if the consumer died right after commit.
		crashy := &loseFirstAck{Receiver: q}
		runConsumer(t, f.DeadLetters, crashy, m.wrap(f, effectOf(f, succeed)), 1, func() bool { return q.Len() == 0 })
		if crashy.lost.Load() != 1 {
			t.Fatal("the first ack was not lost; the test proves nothing")
		}
		expectEffects(t, f, map[string]int{"ship": 1})
	})

	t.Run("FailedAttemptsLeaveNoEffect", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmemory.New(nil)
		msg, _ := outbox.New(Note{Text: "flaky"}).Encode()
		if err := q.Send(ctx, []outbox.Message{msg}); err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		h := effectOf(f, func(outbox.Event[Note]) error {
			if calls.Add(1) < 3 {
				return errors.New("downstream timeout")
			}
			return nil
		})
		runConsumer(t, f.DeadLetters, q, m.wrap(f, h), 1, func() bool { return q.Len() == 0 })
		if calls.Load() != 3 {
			t.Fatalf("handler ran %d times, want 3", calls.Load())
		}
		expectEffects(t, f, map[string]int{"flaky": 1})
	})
}

func deadLetterListReplayDiscard[TTx any](t *testing.T, f *IdempotencyFixture[TTx]) {
	ctx := context.Background()
	q := outboxmemory.New(nil)
	broken := true
	var mu sync.Mutex
	h := f.Idempotent(effectOf(f, func(e outbox.Event[Note]) error {
		mu.Lock()
		defer mu.Unlock()
		if broken && e.Payload.Text == "poison" {
			return fmt.Errorf("cannot handle %q", e.Payload.Text)
		}
		return nil
	}), nil)
	poison := outbox.New(Note{Text: "poison"}, outbox.WithKey("k"))
	pm, _ := poison.Encode()
	unknown, _ := outbox.New(Poison{N: 1}).Encode()
	fine, _ := outbox.New(Note{Text: "fine"}).Encode()
	if err := q.Send(ctx, []outbox.Message{pm, unknown, fine}); err != nil {
		t.Fatal(err)
	}
	runConsumer(t, f.DeadLetters, q, h, 1, func() bool { return q.Len() == 0 })
	expectEffects(t, f, map[string]int{"fine": 1})

	pending, err := f.DeadLetters.List(ctx, deadletter.Filter{Status: deadletter.StatusPending, Stage: deadletter.StageConsumer, Consumer: "outboxtest"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 2 {
		t.Fatalf("dead letters: %+v, want the poison and the unknown event", pending)
	}
	byType := map[string]deadletter.Entry{}
	for _, e := range pending {
		byType[e.Message.Type] = e
	}
	p := byType[Note{}.EventType()]
	if p.Message.ID != poison.ID || p.Attempts != 3 || !strings.Contains(p.Reason, `cannot handle "poison"`) || p.Message.Key != "k" {
		t.Fatalf("poison dead letter %+v", p)
	}
	if u := byType[Poison{}.EventType()]; u.Attempts != 1 || !strings.Contains(u.Reason, "no handler") {
		t.Fatalf("unknown-type dead letter %+v", u)
	}
	if got, err := f.DeadLetters.Get(ctx, p.ID); err != nil || SameMessage(got.Message, pm) != nil {
		t.Fatalf("Get: %+v, %v", got, err)
	}
	since, err := f.DeadLetters.List(ctx, deadletter.Filter{Since: time.Now().Add(time.Hour)})
	if err != nil || len(since) != 0 {
		t.Fatalf("a future Since matched %d entries (%v)", len(since), err)
	}

	// Fix the handler, replay the poison event through the outbox, relay it, handle it.
	mu.Lock()
	broken = false
	mu.Unlock()
	if err := f.DeadLetters.Replay(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.DeadLetters.Replay(ctx, p.ID); !errors.Is(err, deadletter.ErrNotPending) {
		t.Fatalf("second replay: %v, want ErrNotPending", err)
	}
	relay, err := relay.New(f.Store, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("relaying the replayed event: %d, %v", n, err)
	}
	runConsumer(t, f.DeadLetters, q, h, 1, func() bool { return q.Len() == 0 })
	expectEffects(t, f, map[string]int{"fine": 1, "poison": 1})

	u := byType[Poison{}.EventType()]
	if err := f.DeadLetters.Discard(ctx, u.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.DeadLetters.Discard(ctx, u.ID); !errors.Is(err, deadletter.ErrNotPending) {
		t.Fatalf("second discard: %v", err)
	}
	if _, err := f.DeadLetters.Get(ctx, 1<<40); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("Get of a missing id: %v", err)
	}
	left, _ := f.DeadLetters.List(ctx, deadletter.Filter{Status: deadletter.StatusPending})
	all, _ := f.DeadLetters.List(ctx, deadletter.Filter{})
	if len(left) != 0 || len(all) != 2 {
		t.Fatalf("after replay and discard: %d pending, %d kept; want 0 and 2", len(left), len(all))
	}
	bulkAndPrune(t, f.DeadLetters)
}

// bulkAndPrune: Matching, ReplayEach and DiscardEach act on exactly the entries named,
// skipping those no longer pending and refusing what cannot be replayed; Prune deletes
// replayed and discarded entries past the retention, never pending ones. dead holds two
// entries, neither pending.
func bulkAndPrune(t *testing.T, dead deadletter.Table) {
	ctx := context.Background()
	fine, _ := outbox.New(Note{Text: "again"}).Encode()
	for _, e := range []deadletter.Entry{
		{Message: fine, Stage: deadletter.StageRelay, Kind: deadletter.KindGaveUp, Reason: "broker down", Attempts: 10},
		{Stage: deadletter.StageConsumer, Kind: deadletter.KindMalformed, Consumer: "outboxtest", Reason: "not an event",
			BrokerMessageID: "m-1", Raw: &deadletter.Raw{Body: []byte("<garbage>")}},
	} {
		if err := dead.Add(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := deadletter.Matching(ctx, dead, deadletter.Filter{Status: deadletter.StatusPending, Limit: 1})
	if err != nil || len(ids) != 2 {
		t.Fatalf("Matching pending, one per page: %v, %v; want the 2 new entries", ids, err)
	}
	var handled []int
	r, err := deadletter.ReplayEach(ctx, dead, ids, func(n int) { handled = append(handled, n) })
	if err != nil || r.Done != 1 || r.Skipped != 0 || len(r.Refused) != 1 || r.Refused[ids[1]] == nil ||
		!errors.Is(r.Refused[ids[1]], deadletter.ErrNotReplayable) || !slices.Equal(handled, []int{1, 2}) {
		t.Fatalf("ReplayEach: %+v, %v, progress %v; want 1 done and the malformed entry refused", r, err, handled)
	}
	if r, err := deadletter.DiscardEach(ctx, dead, ids, nil); err != nil || r.Done != 1 || r.Skipped != 1 {
		t.Fatalf("DiscardEach: %+v, %v; want the malformed entry discarded, the replayed one skipped", r, err)
	}
	if err := dead.Add(ctx, deadletter.Entry{Message: fine, Stage: deadletter.StageRelay, Reason: "still pending", Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if n, err := dead.Prune(ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("Prune with a retention of an hour: %d, %v; want nothing deleted", n, err)
	}
	// A negative retention reaches entries whose status changed this very instant.
	if n, err := dead.Prune(ctx, -time.Minute, 3); err != nil || n != 3 {
		t.Fatalf("Prune, limit 3: %d, %v; want 3", n, err)
	}
	if n, err := dead.Prune(ctx, -time.Minute, 10); err != nil || n != 1 {
		t.Fatalf("Prune again: %d, %v; want the last of the 4 replayed or discarded", n, err)
	}
	if _, err := dead.Prune(ctx, 0, 0); err == nil {
		t.Fatal("Prune with limit 0 succeeded")
	}
	all, err := dead.List(ctx, deadletter.Filter{})
	if err != nil || len(all) != 1 || all[0].Status != deadletter.StatusPending {
		t.Fatalf("after Prune: %+v, %v; want the pending entry alone", all, err)
	}
}

// skipSeen: SkipSeen runs a handler once per event across duplicates, records an event only
// after its handler succeeded, and skips what Idempotent recorded.
func skipSeen[TTx any](t *testing.T, f *IdempotencyFixture[TTx]) {
	ctx := consumer.WithInfo(context.Background(), consumer.Info{Consumer: "skipper", Attempt: 1})
	var mu sync.Mutex
	runs := map[string]int{}
	failing := true
	h := f.SkipSeen(func(_ context.Context, e outbox.Event[Note]) error {
		mu.Lock()
		defer mu.Unlock()
		runs[e.Payload.Text]++
		if e.Payload.Text == "flaky" && failing {
			failing = false
			return errors.New("mail server down")
		}
		return nil
	})
	mail, flaky := outbox.New(Note{Text: "mail"}), outbox.New(Note{Text: "flaky"})
	for _, e := range []outbox.Event[Note]{mail, mail, flaky, mail} {
		_ = h(ctx, e)
	}
	if err := h(ctx, flaky); err != nil { // the retry of the failed one
		t.Fatal(err)
	}
	if err := h(ctx, flaky); err != nil {
		t.Fatal(err)
	}
	if runs["mail"] != 1 || runs["flaky"] != 2 {
		t.Fatalf("SkipSeen ran the handler %v; want mail once, flaky twice (failed, then succeeded)", runs)
	}
	// An event recorded by Idempotent under the same consumer name is skipped too.
	handled := outbox.New(Note{Text: "handled"})
	if err := f.Idempotent(effectOf(f, succeed), nil)(ctx, handled); err != nil {
		t.Fatal(err)
	}
	if err := h(ctx, handled); err != nil || runs["handled"] != 0 {
		t.Fatalf("SkipSeen of an event already handled: ran %d times (%v)", runs["handled"], err)
	}
}

// recordInTheCallersTransaction: the inbox records keys only when the caller's transaction
// commits, reports duplicates (also within one RecordMany), and counts keys per consumer.
func recordInTheCallersTransaction[TTx any](t *testing.T, f *IdempotencyFixture[TTx]) {
	ctx := context.Background()
	a := idempotency.Key{Consumer: "a", EventID: outbox.New(Note{}).ID}
	// The same event for another consumer, whose name has what SQL and array literals quote.
	b := idempotency.Key{Consumer: `b "quoted", \ {x,y}`, EventID: a.EventID}
	c := idempotency.Key{Consumer: "a", EventID: outbox.New(Note{}).ID}
	rollback := errors.New("rolled back on purpose")
	err := f.Inbox.InTx(ctx, func(tx TTx) error {
		fresh, err := f.Inbox.Record(ctx, tx, a)
		if err != nil || !fresh {
			t.Errorf("Record of a new key: %v, %v", fresh, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("InTx returned %v, want fn's error", err)
	}
	if seen, err := f.Inbox.Seen(ctx, a); err != nil || seen {
		t.Fatalf("a key recorded in a rolled-back transaction is seen: %v, %v", seen, err)
	}
	err = f.Inbox.InTx(ctx, func(tx TTx) error {
		fresh, err := f.Inbox.RecordMany(ctx, tx, []idempotency.Key{a, b, a})
		if err != nil {
			return err
		}
		if fmt.Sprint(fresh) != "[true true false]" {
			t.Errorf("RecordMany(a, b, a) = %v, want [true true false]", fresh)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = f.Inbox.InTx(ctx, func(tx TTx) error {
		if fresh, err := f.Inbox.Record(ctx, tx, a); err != nil || fresh {
			t.Errorf("Record of a committed key: %v, %v; want a duplicate", fresh, err)
		}
		fresh, err := f.Inbox.RecordMany(ctx, tx, []idempotency.Key{c, b})
		if err != nil || fmt.Sprint(fresh) != "[true false]" {
			t.Errorf("RecordMany(c, b) = %v, %v; want [true false]", fresh, err)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []idempotency.Key{a, b, c} {
		if seen, err := f.Inbox.Seen(ctx, k); err != nil || !seen {
			t.Fatalf("key %s is not seen after commit: %v", k, err)
		}
	}
	counts, err := f.Inbox.Counts(ctx)
	if err != nil || len(counts) != 2 || counts["a"] != 2 || counts[b.Consumer] != 1 {
		t.Fatalf("Counts = %v, %v; want a:2 and %s:1", counts, err, b.Consumer)
	}
	// A panic in fn rolls the transaction back and reaches the caller.
	d := idempotency.Key{Consumer: "a", EventID: outbox.New(Note{}).ID}
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Error("InTx swallowed fn's panic")
			}
		}()
		_ = f.Inbox.InTx(ctx, func(tx TTx) error {
			_, _ = f.Inbox.Record(ctx, tx, d)
			panic("handler bug")
		})
	}()
	if seen, err := f.Inbox.Seen(ctx, d); err != nil || seen {
		t.Fatalf("a key recorded before a panic is seen: %v, %v", seen, err)
	}
}

// pruneInbox: PruneInbox deletes the keys older than the retention, at most limit per call,
// and keeps the recent ones, which still absorb duplicates.
func pruneInbox[TTx any](t *testing.T, f *IdempotencyFixture[TTx]) {
	ctx := consumer.WithInfo(context.Background(), consumer.Info{Consumer: "pruner", Attempt: 1})
	h := f.Idempotent(effectOf(f, succeed), nil)
	old := make([]outbox.Event[Note], 3)
	for i := range old {
		old[i] = outbox.New(Note{N: i})
		if err := h(ctx, old[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.AgeInbox(ctx, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	recent := []outbox.Event[Note]{outbox.New(Note{N: 10}), outbox.New(Note{N: 11})}
	for _, e := range recent {
		if err := h(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := f.PruneInbox(ctx, 24*time.Hour, 2); err != nil || n != 2 {
		t.Fatalf("first prune: %d, %v; want 2 (the limit)", n, err)
	}
	if n, err := f.PruneInbox(ctx, 24*time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("second prune: %d, %v; want the last expired key", n, err)
	}
	if n, err := f.PruneInbox(ctx, 24*time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("third prune: %d, %v; want nothing left to prune", n, err)
	}
	if _, err := f.PruneInbox(ctx, 24*time.Hour, 0); err == nil {
		t.Fatal("PruneInbox with limit 0 succeeded")
	}
	if counts, err := f.Inbox.Counts(ctx); err != nil || counts["pruner"] != 2 {
		t.Fatalf("after pruning: %v (%v); want the 2 recent keys", counts, err)
	}
	for _, e := range append(recent, old[0]) {
		if err := h(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// The recent keys absorbed their duplicates; the pruned one no longer does.
	expectEffects(t, f, map[string]int{"0": 2, "1": 1, "2": 1, "10": 1, "11": 1})
}

func runConsumer(t *testing.T, dl deadletter.Writer, r outbox.Receiver, h consumer.Handler[Note], concurrency int, done func() bool) {
	t.Helper()
	c, err := consumer.New(r, &consumer.Config{Name: "outboxtest", DeadLetters: dl, MaxAttempts: 3, Concurrency: concurrency,
		BatchSize: concurrency, RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, h)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- c.Run(ctx) }()
	WaitFor(t, 60*time.Second, "the consumer to settle every message", done)
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// expectEffects checks the effect rows by text; want lists every text expected.
func expectEffects[TTx any](t *testing.T, f *IdempotencyFixture[TTx], want map[string]int) {
	t.Helper()
	got, err := f.Effects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	texts := maps.Clone(want)
	maps.Copy(texts, got)
	var wrong []string
	for _, text := range slices.Sorted(maps.Keys(texts)) {
		if got[text] != want[text] {
			wrong = append(wrong, fmt.Sprintf("%q: %d, want %d", text, got[text], want[text]))
		}
	}
	if len(wrong) > 0 {
		if len(wrong) > 10 {
			wrong = append(wrong[:10], fmt.Sprintf("and %d more", len(wrong)-10))
		}
		t.Fatalf("effect rows by text: %s", strings.Join(wrong, "; "))
	}
}

// loseFirstAck wraps a receiver so the first delivery's Ack is dropped.
type loseFirstAck struct {
	outbox.Receiver
	lost atomic.Int32
}

func (l *loseFirstAck) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	ds, err := l.Receiver.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = &ackLoser{Delivery: d, l: l}
	}
	return ds, err
}

type ackLoser struct {
	outbox.Delivery
	l *loseFirstAck
}

func (a *ackLoser) Ack(ctx context.Context) error {
	if a.l.lost.CompareAndSwap(0, 1) {
		return errors.New("consumer died before acknowledging")
	}
	return a.Delivery.Ack(ctx)
}
