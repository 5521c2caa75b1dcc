package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmem "github.com/txoutbox/outbox/transports/memory"
)

const waitLimit = 30 * time.Second

// TestGroupedIdempotency runs the adapters' exactly-once and dead-letter suite against the
// grouped handler.
func TestGroupedIdempotency(t *testing.T) {
	exerciseIdempotency(t, func(o *testOutbox, h outboxpgx.TxHandler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
		return outboxpgx.IdempotentGroupedAt(o.Outbox, o.pool, h, nil)
	})
}

// groupEffects creates an effects table without a unique key (so a duplicate effect would
// show) and returns it with a TxHandler that writes one row per call: the event, its N, the
// consumer name from consumer.InfoFrom (a missing one fails the call permanently) and the
// writing transaction's ID.
func groupEffects(t *testing.T, o *testOutbox) (string, outboxpgx.TxHandler[outboxtestNote]) {
	t.Helper()
	effects := o.schema + ".effects"
	if _, err := o.pool.Exec(context.Background(), "CREATE TABLE "+effects+
		" (event_id uuid NOT NULL, n int NOT NULL, consumer text NOT NULL, xid bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return effects, func(ctx context.Context, tx pgx.Tx, e outbox.Event[outboxtestNote]) error {
		info, ok := consumer.InfoFrom(ctx)
		if !ok || info.Consumer == "" || info.Attempt < 1 {
			return outbox.Permanent(fmt.Errorf("handler context without delivery info: %+v", info))
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1, $2, $3, txid_current())", e.ID, e.Payload.N, info.Consumer)
		return err
	}
}

// runGroupConsumer runs a consumer with Concurrency 16 and the grouped handler h until q is
// drained, then stops it.
func runGroupConsumer(t *testing.T, o *testOutbox, q *outboxmem.Queue, name string, h consumer.Handler[outboxtestNote]) {
	t.Helper()
	c, err := consumer.New(q, &consumer.Config{Name: name, DeadLetters: o.NewDeadLetters(o.pool),
		Concurrency: 16, BatchSize: 16, MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, h)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	outboxtest.WaitFor(t, waitLimit, "the consumer to settle every message", func() bool { return q.Len() == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// countRows returns count(*) and count(DISTINCT expr) of table, optionally filtered.
func countRows(t *testing.T, o *testOutbox, table, expr, where string) (rows, distinct int) {
	t.Helper()
	if where != "" {
		where = " WHERE " + where
	}
	if err := o.pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT "+expr+") FROM "+table+where).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// TestGroupedExactlyOnceUnderDuplicates: every event is delivered three times in a row, so
// its copies run concurrently (keyless ones in one batch, or in two at once); each event
// still has exactly one effect, and InfoFrom works inside h. Small batches and more
// transactions exercise the hand-offs.
func TestGroupedExactlyOnceUnderDuplicates(t *testing.T) {
	for name, cfg := range map[string]*outboxpgx.GroupConfig{
		"Defaults":         nil,
		"OneTransaction":   {MaxTransactions: 1},
		"SmallBatchesMany": {MaxEvents: 4, MaxTransactions: 3},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const events, copies = 300, 3
			o := newTestOutbox(t)
			effects, h := groupEffects(t, o)
			q := outboxmem.New(nil)
			for i := range events {
				var opts []outbox.Option
				if i%3 == 0 {
					opts = append(opts, outbox.WithKey(fmt.Sprintf("k%d", i%10))) // some keyed, in order
				}
				m, _ := outbox.New(outboxtestNote{N: i}, opts...).Encode()
				for range copies {
					if err := q.Send(context.Background(), []outbox.Message{m}); err != nil {
						t.Fatal(err)
					}
				}
			}
			runGroupConsumer(t, o, q, "grouped", outboxpgx.IdempotentGroupedAt(o.Outbox, o.pool, h, cfg))

			if rows, distinct := countRows(t, o, effects, "event_id", "consumer = 'grouped'"); rows != events || distinct != events {
				t.Fatalf("%d effect rows for %d distinct events, want %d and %d", rows, distinct, events, events)
			}
			if rows, _ := countRows(t, o, o.schema+".outbox_inbox", "event_id", ""); rows != events {
				t.Fatalf("%d inbox rows, want %d", rows, events)
			}
			if dls, err := o.NewDeadLetters(o.pool).List(context.Background(), deadletter.Filter{}); err != nil || len(dls) != 0 {
				t.Fatalf("dead letters %+v (%v), want none", dls, err)
			}
		})
	}
}

// TestGroupedCommitsFewerTransactions: with 16 events in flight, events really share
// transactions: far fewer distinct transaction IDs than events.
func TestGroupedCommitsFewerTransactions(t *testing.T) {
	const events = 400
	o := newTestOutbox(t)
	effects, h := groupEffects(t, o)
	q, _ := queuedNotes(t, events)
	runGroupConsumer(t, o, q, "grouped", outboxpgx.IdempotentGroupedAt(o.Outbox, o.pool, h, nil))

	rows, txs := countRows(t, o, effects, "xid", "")
	if got, _ := countRows(t, o, effects, "event_id", ""); got != events || rows != events {
		t.Fatalf("%d effect rows, want %d", rows, events)
	}
	t.Logf("%d events in %d transactions (%.1f per transaction)", events, txs, float64(events)/float64(txs))
	// Ungrouped, 400 events take 400 transactions; grouped, 83–123 were measured. The bound
	// is loose so that a loaded machine cannot fail it; TestGroupedBatchesHandOff pins the
	// exact batching.
	if txs > events*3/4 {
		t.Fatalf("%d events took %d transactions: the events were not grouped", events, txs)
	}
}

// TestGroupedFailingEventIsDeadLettered: one event that always fails, among many handled
// concurrently, is retried and dead-lettered per the consumer's config with no effect, and
// every other event commits exactly once.
func TestGroupedFailingEventIsDeadLettered(t *testing.T) {
	const events, poisonN = 200, 100
	o := newTestOutbox(t)
	effects, effect := groupEffects(t, o)
	var poisonCalls atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, e outbox.Event[outboxtestNote]) error {
		if err := effect(ctx, tx, e); err != nil {
			return err
		}
		if e.Payload.N == poisonN {
			poisonCalls.Add(1)
			return errors.New("poison")
		}
		return nil
	}
	q, msgs := queuedNotes(t, events)
	runGroupConsumer(t, o, q, "grouped", outboxpgx.IdempotentGroupedAt(o.Outbox, o.pool, h, nil))

	if rows, distinct := countRows(t, o, effects, "event_id", ""); rows != events-1 || distinct != events-1 {
		t.Fatalf("%d effect rows for %d events, want %d for %d", rows, distinct, events-1, events-1)
	}
	if rows, _ := countRows(t, o, effects, "event_id", fmt.Sprintf("n = %d", poisonN)); rows != 0 {
		t.Fatalf("the failing event left %d effect rows", rows)
	}
	dls, err := o.NewDeadLetters(o.pool).List(context.Background(), deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].Message.ID != msgs[poisonN].ID || dls[0].Attempts != 3 || !strings.Contains(dls[0].Reason, "poison") {
		t.Fatalf("dead letters %+v, want the poison event after 3 attempts", dls)
	}
	t.Logf("the failing handler ran %d times for 3 deliveries (the extra runs were in batches)", poisonCalls.Load())
}

// groupRig calls a grouped handler directly, without a consumer, to line calls up
// deterministically: h blocks on the event with N == gate until release is closed, so the
// calls made meanwhile queue up (queued counts them) and then form one batch.
type groupRig struct {
	o       *testOutbox
	effects string
	h       consumer.Handler[outboxtestNote]
	queued  func() int
	gated   chan struct{} // closed when h blocks on the gate event
	release chan struct{}
	// gateResult is the gate call's result, once hold started it.
	gateResult <-chan error

	mu    sync.Mutex
	calls map[int]int // h calls per N
}

const (
	gate    = 0
	poison  = -1 // h fails after writing its effect
	panicky = -2 // h panics after writing its effect
)

// newGroupRig returns a rig whose handler runs one transaction at a time (so calls queue
// behind the gate) and batches of up to maxEvents (0: the default).
func newGroupRig(t *testing.T, maxEvents int) *groupRig {
	o := newTestOutbox(t)
	r := &groupRig{o: o, gated: make(chan struct{}), release: make(chan struct{}), calls: map[int]int{}}
	var effect outboxpgx.TxHandler[outboxtestNote]
	r.effects, effect = groupEffects(t, o)
	r.h, r.queued = outboxpgx.IdempotentGroupedWithQueue(o.Outbox, o.pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[outboxtestNote]) error {
		n := e.Payload.N
		r.mu.Lock()
		r.calls[n]++
		first := r.calls[n] == 1
		r.mu.Unlock()
		if err := effect(ctx, tx, e); err != nil {
			return err
		}
		switch {
		case n == gate && first:
			close(r.gated)
			<-r.release
		case n == poison:
			return errors.New("poison")
		case n == panicky:
			panic("panicky handler")
		}
		return nil
	}, &outboxpgx.GroupConfig{MaxEvents: maxEvents, MaxTransactions: 1})
	return r
}

// call runs the handler for a new event N in a goroutine and returns its result; a panic
// comes back as an error starting with "panic: ".
func (r *groupRig) call(ctx context.Context, n int) <-chan error {
	out := make(chan error, 1)
	ctx = consumer.WithInfo(ctx, consumer.Info{Consumer: "direct", Attempt: 1})
	go func() {
		defer func() {
			if p := recover(); p != nil {
				out <- fmt.Errorf("panic: %v", p)
			}
		}()
		out <- r.h(ctx, outbox.New(outboxtestNote{N: n}))
	}()
	return out
}

func (r *groupRig) callsOf(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[n]
}

// hold starts the gate call and waits until it blocks in h: calls made now queue behind it.
func (r *groupRig) hold(t *testing.T) {
	t.Helper()
	r.gateResult = r.call(context.Background(), gate)
	select {
	case <-r.gated:
	case <-time.After(waitLimit):
		t.Fatal("the gate call never reached its handler")
	}
}

// open lets the gate call finish, so the calls queued behind it run.
func (r *groupRig) open(t *testing.T) {
	t.Helper()
	close(r.release)
	if err := result(t, r.gateResult); err != nil {
		t.Fatalf("gate: %v", err)
	}
}

// batch holds the gate, queues a call for each of ns behind it, opens the gate, and returns
// the calls' results.
func (r *groupRig) batch(t *testing.T, ns ...int) map[int]<-chan error {
	t.Helper()
	r.hold(t)
	results := map[int]<-chan error{}
	for _, n := range ns {
		results[n] = r.call(context.Background(), n)
	}
	outboxtest.WaitFor(t, waitLimit, "the calls to queue behind the gate", func() bool { return r.queued() == len(ns) })
	r.open(t)
	return results
}

func result(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(waitLimit):
		t.Fatal("a handler call never returned")
		return nil
	}
}

// effectsOf returns the effect rows of event N.
func (r *groupRig) effectsOf(t *testing.T, n int) int {
	t.Helper()
	rows, _ := countRows(t, r.o, r.effects, "event_id", fmt.Sprintf("n = %d", n))
	return rows
}

// TestGroupedBatchWithAFailingEvent: a batch of ten in which one handler fails rolls back,
// and each event is then handled alone: the nine commit exactly once and succeed, the
// failing one gets its own error and leaves no effect.
func TestGroupedBatchWithAFailingEvent(t *testing.T) {
	r := newGroupRig(t, 0)
	ns := []int{1, 2, 3, 4, poison, 5, 6, 7, 8, 9}
	results := r.batch(t, ns...)
	for _, n := range ns {
		err := result(t, results[n])
		if n == poison {
			if err == nil || !strings.Contains(err.Error(), "poison") {
				t.Fatalf("failing event: err = %v, want its own error", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("event %d: %v, want success despite the failing event in its batch", n, err)
		}
		if got := r.effectsOf(t, n); got != 1 {
			t.Fatalf("event %d has %d effect rows, want 1", n, got)
		}
	}
	if got := r.effectsOf(t, poison); got != 0 {
		t.Fatalf("the failing event left %d effect rows", got)
	}
	if got := r.callsOf(poison); got != 2 {
		t.Fatalf("the failing handler ran %d times, want 2: in the batch, then alone", got)
	}
	if got := r.effectsOf(t, gate); got != 1 {
		t.Fatalf("the gate event has %d effect rows", got)
	}
}

// TestGroupedBatchWithAPanic: a handler that panics in a batch rolls it back without
// stranding anyone; the others succeed, and the panic reaches its own caller (where the
// consumer turns it into a permanent failure).
func TestGroupedBatchWithAPanic(t *testing.T) {
	r := newGroupRig(t, 0)
	ns := []int{1, 2, panicky, 3}
	results := r.batch(t, ns...)
	for _, n := range ns {
		err := result(t, results[n])
		switch {
		case n == panicky && (err == nil || !strings.HasPrefix(err.Error(), "panic: panicky handler")):
			t.Fatalf("panicking event: %v, want its panic", err)
		case n != panicky && err != nil:
			t.Fatalf("event %d: %v", n, err)
		case n != panicky && r.effectsOf(t, n) != 1:
			t.Fatalf("event %d has %d effect rows, want 1", n, r.effectsOf(t, n))
		}
	}
	if got := r.effectsOf(t, panicky); got != 0 {
		t.Fatalf("the panicking event left %d effect rows", got)
	}
}

// TestGroupedBatchesHandOff: eight calls queued behind a running transaction, with batches
// of three, are handled in three successive transactions (3, 3, 2): each leader hands on to
// the next call in line and none is stranded.
func TestGroupedBatchesHandOff(t *testing.T) {
	r := newGroupRig(t, 3)
	ns := []int{1, 2, 3, 4, 5, 6, 7, 8}
	results := r.batch(t, ns...)
	for _, n := range ns {
		if err := result(t, results[n]); err != nil {
			t.Fatalf("event %d: %v", n, err)
		}
	}
	rows, txs := countRows(t, r.o, r.effects, "xid", "n > 0")
	if rows != len(ns) || txs != 3 {
		t.Fatalf("%d effect rows in %d transactions, want %d in 3", rows, txs, len(ns))
	}
}

// TestGroupedCancelWhileQueued: a call whose ctx ends while it waits for a batch returns
// ctx.Err() at once, is never handled, strands no one behind it and leaks no goroutine.
func TestGroupedCancelWhileQueued(t *testing.T) {
	r := newGroupRig(t, 0)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r.hold(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cancelled := r.call(ctx, 1) // the head of the queue: the next leader
	outboxtest.WaitFor(t, waitLimit, "the call to queue", func() bool { return r.queued() == 1 })
	behind := r.call(context.Background(), 2)
	outboxtest.WaitFor(t, waitLimit, "the second call to queue", func() bool { return r.queued() == 2 })

	cancel()
	if err := result(t, cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", err)
	}
	if got := r.queued(); got != 1 {
		t.Fatalf("%d calls queued after the cancellation, want 1", got)
	}
	r.open(t)
	if err := result(t, behind); err != nil {
		t.Fatalf("the call behind the cancelled one: %v", err)
	}
	if r.callsOf(1) != 0 || r.effectsOf(t, 1) != 0 || r.effectsOf(t, 2) != 1 {
		t.Fatalf("cancelled event: %d calls, %d effects; the one behind: %d effects; want 0, 0, 1",
			r.callsOf(1), r.effectsOf(t, 1), r.effectsOf(t, 2))
	}
}

func TestGroupedNeedsConsumerName(t *testing.T) {
	o := newTestOutbox(t)
	h := outboxpgx.IdempotentGroupedAt(o.Outbox, o.pool, func(context.Context, pgx.Tx, outbox.Event[outboxtestNote]) error { return nil }, nil)
	if err := h(context.Background(), outbox.New(outboxtestNote{})); err == nil || !outbox.IsPermanent(err) {
		t.Fatalf("err = %v, want a permanent error about the missing consumer name", err)
	}
}

// queuedNotes returns an in-memory queue holding n keyless notes (N = 0…n-1), and them.
func queuedNotes(t *testing.T, n int) (*outboxmem.Queue, []outbox.Message) {
	t.Helper()
	q := outboxmem.New(nil)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i], _ = outbox.New(outboxtestNote{N: i}).Encode()
	}
	if err := q.Send(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	return q, msgs
}
