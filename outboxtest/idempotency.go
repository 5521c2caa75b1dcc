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

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	outboxmem "github.com/txoutbox/outbox/transports/memory"
)

// IdempotencyFixture is one fresh outbox (with its inbox and dead-letter table) of the
// adapter under test.
type IdempotencyFixture struct {
	// Store is the relay store of the outbox (replayed dead letters come back through it).
	Store outbox.Store
	// Handler returns the adapter's idempotent wrapper around a handler that, in the
	// wrapper's transaction, inserts one row naming the event into an effects table and
	// then returns fail(event) — so a failing attempt's row must roll back.
	Handler func(fail func(outbox.Event[Note]) error) consumer.Handler[Note]
	// Effects counts the rows of the effects table.
	Effects func(ctx context.Context) (int, error)
	// DeadLetters is the outbox's dead-letter table.
	DeadLetters deadletter.Table
}

// ExerciseIdempotency runs the exactly-once and dead-letter suite for an adapter's
// idempotency wrapper and dead-letter table.
func ExerciseIdempotency(t *testing.T, newFixture func(t *testing.T) *IdempotencyFixture) {
	t.Helper()
	ctx := context.Background()
	ok := func(outbox.Event[Note]) error { return nil }

	t.Run("FiveDeliveriesOneEffect", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmem.New(nil)
		m, _ := outbox.New(Note{Text: "pay"}).Encode()
		for range 5 { // the broker delivers the same event five times
			if err := q.Send(ctx, []outbox.Message{m}); err != nil {
				t.Fatal(err)
			}
		}
		runConsumer(t, f, q, f.Handler(ok), func() bool { return q.Len() == 0 })
		expectEffects(t, f, 1)
	})

	t.Run("CrashBetweenCommitAndAck", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmem.New(&outboxmem.Config{VisibilityTimeout: 200 * time.Millisecond})
		m, _ := outbox.New(Note{Text: "ship"}).Encode()
		if err := q.Send(ctx, []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
		// The first delivery's ack is lost, as if the consumer died right after commit.
		crashy := &loseFirstAck{Receiver: q}
		runConsumer(t, f, crashy, f.Handler(ok), func() bool { return q.Len() == 0 })
		if crashy.lost.Load() != 1 {
			t.Fatal("the first ack was not lost; the test proves nothing")
		}
		expectEffects(t, f, 1)
	})

	t.Run("FailedAttemptsLeaveNoEffect", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmem.New(nil)
		m, _ := outbox.New(Note{Text: "flaky"}).Encode()
		if err := q.Send(ctx, []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		h := f.Handler(func(outbox.Event[Note]) error {
			if calls.Add(1) < 3 {
				return errors.New("downstream timeout")
			}
			return nil
		})
		runConsumer(t, f, q, h, func() bool { return q.Len() == 0 })
		if calls.Load() != 3 {
			t.Fatalf("handler ran %d times, want 3", calls.Load())
		}
		expectEffects(t, f, 1)
	})

	t.Run("DeadLetterListReplayDiscard", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmem.New(nil)
		broken := true
		var mu sync.Mutex
		h := f.Handler(func(e outbox.Event[Note]) error {
			mu.Lock()
			defer mu.Unlock()
			if broken && e.Payload.Text == "poison" {
				return fmt.Errorf("cannot handle %q", e.Payload.Text)
			}
			return nil
		})
		poison := outbox.New(Note{Text: "poison"}, outbox.WithKey("k"))
		pm, _ := poison.Encode()
		unknown, _ := outbox.New(Poison{N: 1}).Encode()
		fine, _ := outbox.New(Note{Text: "fine"}).Encode()
		if err := q.Send(ctx, []outbox.Message{pm, unknown, fine}); err != nil {
			t.Fatal(err)
		}
		runConsumer(t, f, q, h, func() bool { return q.Len() == 0 })
		expectEffects(t, f, 1)

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
		relay, err := outbox.NewRelay(f.Store, q, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := relay.RunOnce(ctx); err != nil || n != 1 {
			t.Fatalf("relaying the replayed event: %d, %v", n, err)
		}
		runConsumer(t, f, q, h, func() bool { return q.Len() == 0 })
		expectEffects(t, f, 2)

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
	})
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

func runConsumer(t *testing.T, f *IdempotencyFixture, r outbox.Receiver, h consumer.Handler[Note], done func() bool) {
	t.Helper()
	c, err := consumer.New(r, &consumer.Config{Name: "outboxtest", DeadLetters: f.DeadLetters, MaxAttempts: 3,
		RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, h)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- c.Run(ctx) }()
	WaitFor(t, 30*time.Second, "the consumer to settle every message", done)
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

func expectEffects(t *testing.T, f *IdempotencyFixture, want int) {
	t.Helper()
	n, err := f.Effects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("%d effect rows, want %d", n, want)
	}
}
