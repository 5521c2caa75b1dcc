package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// exerciseGroupCommit runs the cases that only group commit has: many events at once, a
// failing event among them, and the batches' hand-offs, panics and cancellations, on the
// adapter's own inbox.
func exerciseGroupCommit[TTx any](t *testing.T, newFixture func(t *testing.T) *IdempotencyFixture[TTx]) {
	// Every event is delivered three times in a row, so its copies run concurrently (in one
	// batch, or in two at once); each event still has exactly one effect. Small batches and
	// more transactions exercise the hand-offs.
	for name, cfg := range map[string]*idempotency.GroupConfig{
		"ExactlyOnceUnderDuplicates/Defaults":         nil,
		"ExactlyOnceUnderDuplicates/SmallBatchesMany": {MaxEvents: 4, MaxTransactions: 3},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const events, copies = 150, 3
			f := newFixture(t)
			q := outboxmemory.New(nil)
			want := map[string]int{}
			for i := range events {
				var opts []outbox.Option
				if i%3 == 0 {
					opts = append(opts, outbox.WithKey(fmt.Sprintf("k%d", i%10))) // some keyed, in order
				}
				m, _ := outbox.New(Note{N: i}, opts...).Encode()
				for range copies {
					if err := q.Send(context.Background(), []outbox.Message{m}); err != nil {
						t.Fatal(err)
					}
				}
				want[fmt.Sprint(i)] = 1
			}
			runGroupConsumer(t, f, q, f.Idempotent(effectOf(f, succeed), cfg))
			expectEffects(t, f, want)
			if dls, err := f.DeadLetters.List(context.Background(), deadletter.Filter{}); err != nil || len(dls) != 0 {
				t.Fatalf("dead letters %+v (%v), want none", dls, err)
			}
		})
	}

	// One event that always fails, among many handled concurrently, is retried and
	// dead-lettered per the consumer's config with no effect; every other event commits once.
	t.Run("FailingEventIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		const events, poisonN = 100, 50
		f := newFixture(t)
		q := outboxmemory.New(nil)
		msgs := make([]outbox.Message, events)
		want := map[string]int{}
		for i := range msgs {
			msgs[i], _ = outbox.New(Note{N: i}).Encode()
			if i != poisonN {
				want[fmt.Sprint(i)] = 1
			}
		}
		if err := q.Send(context.Background(), msgs); err != nil {
			t.Fatal(err)
		}
		h := effectOf(f, func(e outbox.Event[Note]) error {
			if e.Payload.N == poisonN {
				return errors.New("poison")
			}
			return nil
		})
		runGroupConsumer(t, f, q, f.Idempotent(h, nil))
		expectEffects(t, f, want)
		dls, err := f.DeadLetters.List(context.Background(), deadletter.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 1 || dls[0].Message.ID != msgs[poisonN].ID || dls[0].Attempts != 3 || !strings.Contains(dls[0].Reason, "poison") {
			t.Fatalf("dead letters %+v, want the poison event after 3 attempts", dls)
		}
	})

	// A batch of ten in which one handler fails rolls back, and each event is then handled
	// alone: the nine commit exactly once and succeed, the failing one gets its own error and
	// leaves no effect.
	t.Run("BatchWithAFailingEvent", func(t *testing.T) {
		t.Parallel()
		r := newGroupRig(t, newFixture(t), 0)
		ns := []int{1, 2, 3, 4, rigPoison, 5, 6, 7, 8, 9}
		results := r.batch(t, ns...)
		for _, n := range ns {
			err := r.result(t, results[n])
			if n == rigPoison {
				if err == nil || !strings.Contains(err.Error(), "poison") {
					t.Fatalf("failing event: err = %v, want its own error", err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("event %d: %v, want success despite the failing event in its batch", n, err)
			}
		}
		want := map[string]int{fmt.Sprint(rigGate): 1}
		for _, n := range ns {
			if n != rigPoison {
				want[fmt.Sprint(n)] = 1
			}
		}
		expectEffects(t, r.f, want)
		if got := r.callsOf(rigPoison); got != 2 {
			t.Fatalf("the failing handler ran %d times, want 2: in the batch, then alone", got)
		}
	})

	// A handler that panics in a batch rolls it back without stranding anyone; the others
	// succeed, and the panic reaches its own caller (where the consumer turns it into a
	// permanent failure).
	t.Run("BatchWithAPanic", func(t *testing.T) {
		t.Parallel()
		r := newGroupRig(t, newFixture(t), 0)
		ns := []int{1, 2, rigPanic, 3}
		results := r.batch(t, ns...)
		for _, n := range ns {
			err := r.result(t, results[n])
			switch {
			case n == rigPanic && (err == nil || !strings.HasPrefix(err.Error(), "panic: panicky handler")):
				t.Fatalf("panicking event: %v, want its panic", err)
			case n != rigPanic && err != nil:
				t.Fatalf("event %d: %v", n, err)
			}
		}
		expectEffects(t, r.f, map[string]int{fmt.Sprint(rigGate): 1, "1": 1, "2": 1, "3": 1})
	})

	// Eight calls queued behind a running transaction, with batches of three, are handled in
	// three successive batches (3, 3, 2): each leader hands on to the next call in line and
	// none is stranded.
	t.Run("BatchesHandOff", func(t *testing.T) {
		t.Parallel()
		r := newGroupRig(t, newFixture(t), 3)
		ns := []int{1, 2, 3, 4, 5, 6, 7, 8}
		results := r.batch(t, ns...)
		want := map[string]int{fmt.Sprint(rigGate): 1}
		for _, n := range ns {
			if err := r.result(t, results[n]); err != nil {
				t.Fatalf("event %d: %v", n, err)
			}
			want[fmt.Sprint(n)] = 1
		}
		expectEffects(t, r.f, want)
		if got := fmt.Sprint(r.in.batches()); got != "[3 3 2]" {
			t.Fatalf("batches of %s keys, want [3 3 2]", got)
		}
	})

	// A call whose ctx ends while it waits for a batch returns ctx.Err() at once, is never
	// handled, and strands no one behind it.
	t.Run("CancelWhileQueued", func(t *testing.T) {
		t.Parallel()
		r := newGroupRig(t, newFixture(t), 0)
		r.hold(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cancelled := r.call(ctx, 1) // the head of the queue: the next leader
		WaitFor(t, rigWait, "the call to queue", func() bool { return r.g.Waiting() == 1 })
		behind := r.call(context.Background(), 2)
		WaitFor(t, rigWait, "the second call to queue", func() bool { return r.g.Waiting() == 2 })

		cancel()
		if err := r.result(t, cancelled); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v, want context.Canceled", err)
		}
		if got := r.g.Waiting(); got != 1 {
			t.Fatalf("%d calls queued after the cancellation, want 1", got)
		}
		r.open(t)
		if err := r.result(t, behind); err != nil {
			t.Fatalf("the call behind the cancelled one: %v", err)
		}
		if r.callsOf(1) != 0 {
			t.Fatalf("the cancelled event's handler ran %d times", r.callsOf(1))
		}
		expectEffects(t, r.f, map[string]int{fmt.Sprint(rigGate): 1, "2": 1})
	})
}

// runGroupConsumer runs a consumer with Concurrency 16 and the grouped handler h until q is
// drained, then stops it.
func runGroupConsumer[TTx any](t *testing.T, f *IdempotencyFixture[TTx], q *outboxmemory.Queue, h consumer.Handler[Note]) {
	t.Helper()
	c, err := consumer.New(q, &consumer.Config{Name: "grouped", DeadLetters: f.DeadLetters,
		Concurrency: 16, BatchSize: 16, MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond,
		Logger: discardLogger})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, h)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	WaitFor(t, 2*time.Minute, "the consumer to settle every message", func() bool { return q.Len() == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

var discardLogger = slog.New(slog.DiscardHandler)

// groupRig calls a Group on the adapter's inbox directly, without a consumer, to line calls
// up deterministically: h blocks on the event with N == rigGate until release is closed, so
// the calls made meanwhile queue up (Waiting counts them) and then form one batch.
type groupRig[TTx any] struct {
	f       *IdempotencyFixture[TTx]
	in      *batchCounter[TTx]
	g       *idempotency.Group[TTx, Note]
	gated   chan struct{} // closed when h blocks on the gate event
	release chan struct{}
	// gateResult is the gate call's result, once hold started it.
	gateResult <-chan error

	mu    sync.Mutex
	calls map[int]int // h calls per N
}

const (
	rigGate   = 1000
	rigPoison = -1 // h fails after writing its effect
	rigPanic  = -2 // h panics after writing its effect
	rigWait   = time.Minute
)

// newGroupRig returns a rig whose group runs one transaction at a time (so calls queue
// behind the gate) and batches of up to maxEvents (0: the default).
func newGroupRig[TTx any](t *testing.T, f *IdempotencyFixture[TTx], maxEvents int) *groupRig[TTx] {
	r := &groupRig[TTx]{f: f, gated: make(chan struct{}), release: make(chan struct{}), calls: map[int]int{}}
	var gatePassed atomic.Bool
	h := effectOf(f, func(e outbox.Event[Note]) error {
		n := e.Payload.N
		r.mu.Lock()
		r.calls[n]++
		r.mu.Unlock()
		switch {
		case n == rigGate && gatePassed.CompareAndSwap(false, true):
			close(r.gated)
			<-r.release
		case n == rigPoison:
			return errors.New("poison")
		case n == rigPanic:
			panic("panicky handler")
		}
		return nil
	})
	r.in = &batchCounter[TTx]{Inbox: f.Inbox}
	r.g = idempotency.NewGroup(idempotency.Inbox[TTx](r.in), h, &idempotency.GroupConfig{MaxEvents: maxEvents, MaxTransactions: 1})
	t.Cleanup(func() {
		select {
		case <-r.release:
		default:
			close(r.release) // a failed test must not leave the gate call blocked
		}
	})
	return r
}

// call runs the group for a new event N in a goroutine and returns its result; a panic comes
// back as an error starting with "panic: ".
func (r *groupRig[TTx]) call(ctx context.Context, n int) <-chan error {
	out := make(chan error, 1)
	ctx = consumer.WithInfo(ctx, consumer.Info{Consumer: "direct", Attempt: 1})
	go func() {
		defer func() {
			if p := recover(); p != nil {
				out <- fmt.Errorf("panic: %v", p)
			}
		}()
		out <- r.g.Handle(ctx, outbox.New(Note{N: n}))
	}()
	return out
}

func (r *groupRig[TTx]) callsOf(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[n]
}

// hold starts the gate call and waits until it blocks in h: calls made now queue behind it.
func (r *groupRig[TTx]) hold(t *testing.T) {
	t.Helper()
	r.gateResult = r.call(context.Background(), rigGate)
	select {
	case <-r.gated:
	case <-time.After(rigWait):
		t.Fatal("the gate call never reached its handler")
	}
}

// open lets the gate call finish, so the calls queued behind it run.
func (r *groupRig[TTx]) open(t *testing.T) {
	t.Helper()
	close(r.release)
	if err := r.result(t, r.gateResult); err != nil {
		t.Fatalf("gate: %v", err)
	}
}

// batch holds the gate, queues a call for each of ns behind it, opens the gate, and returns
// the calls' results.
func (r *groupRig[TTx]) batch(t *testing.T, ns ...int) map[int]<-chan error {
	t.Helper()
	r.hold(t)
	results := map[int]<-chan error{}
	for _, n := range ns {
		results[n] = r.call(context.Background(), n)
	}
	WaitFor(t, rigWait, "the calls to queue behind the gate", func() bool { return r.g.Waiting() == len(ns) })
	r.open(t)
	return results
}

func (r *groupRig[TTx]) result(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(rigWait):
		t.Fatal("a handler call never returned")
		return nil
	}
}

// batchCounter is an inbox that remembers the size of every RecordMany call: the batches.
type batchCounter[TTx any] struct {
	idempotency.Inbox[TTx]
	mu    sync.Mutex
	sizes []int
}

func (b *batchCounter[TTx]) RecordMany(ctx context.Context, tx TTx, keys []idempotency.Key) ([]bool, error) {
	b.mu.Lock()
	b.sizes = append(b.sizes, len(keys))
	b.mu.Unlock()
	return b.Inbox.RecordMany(ctx, tx, keys)
}

func (b *batchCounter[TTx]) batches() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sizes)
}
