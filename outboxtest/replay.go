package outboxtest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
)

// PipelineFixture is a whole pipeline over one fresh outbox and one fresh destination:
// outbox → relay → broker → consumer, with the outbox's dead-letter table.
type PipelineFixture struct {
	Store outboxdriver.Store
	// Publish writes events in one committed transaction.
	Publish     func(ctx context.Context, events ...outbox.Encodable) error
	Sender      outbox.Sender
	Receiver    outbox.Receiver
	DeadLetters deadletter.Table
	// RetryBackoff is the consumer's first redelivery delay; brokers that count visibility
	// in whole seconds need at least 1s. Default 1s.
	RetryBackoff time.Duration
	// Timeout bounds each wait. Default 60s.
	Timeout time.Duration
	// Idempotent wraps h with the adapter's Idempotent over this outbox's inbox (h runs in
	// the inbox's transaction, once per event). ExerciseClaimCheck needs it.
	Idempotent func(h consumer.Handler[Note]) consumer.Handler[Note]
	// Dedup: the destination drops a re-sent message with an ID it has seen recently.
	Dedup bool
}

// ExerciseRetryDeadLetterReplay proves, against a real broker, the consumer's failure path:
// a handler error is retried through the broker's redelivery with backoff, counted by the
// broker's delivery count; after MaxAttempts the event is dead-lettered (and acknowledged,
// so other events flow); once the handler is fixed, replaying the dead letter sends it back
// through the outbox and relay, and it is handled.
func ExerciseRetryDeadLetterReplay(t *testing.T, f *PipelineFixture) {
	t.Helper()
	if f.RetryBackoff == 0 {
		f.RetryBackoff = time.Second
	}
	if f.Timeout == 0 {
		f.Timeout = 60 * time.Second
	}
	ctx := context.Background()
	const maxAttempts = 3

	poison := outbox.New(Note{Text: "poison"})
	fine := outbox.New(Note{Text: "fine"})
	if err := f.Publish(ctx, poison, fine); err != nil {
		t.Fatal(err)
	}
	relay, err := relay.New(f.Store, f.Sender, nil)
	if err != nil {
		t.Fatal(err)
	}
	relayOnce := func(want int) {
		t.Helper()
		got := 0
		WaitFor(t, f.Timeout, "the relay to send", func() bool {
			n, err := relay.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got += n
			return got >= want
		})
	}
	relayOnce(2)

	var (
		mu       sync.Mutex
		broken   = true
		attempts []int
		times    []time.Time
		handled  = map[string]int{}
	)
	c, err := consumer.New(f.Receiver, &consumer.Config{
		Name: "replay", DeadLetters: f.DeadLetters, MaxAttempts: maxAttempts,
		RetryBackoff: f.RetryBackoff, MaxRetryBackoff: 2 * f.RetryBackoff,
	})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[Note]) error {
		mu.Lock()
		defer mu.Unlock()
		if e.Payload.Text == "poison" && broken {
			info, _ := consumer.InfoFrom(ctx)
			attempts = append(attempts, info.Attempt)
			times = append(times, time.Now())
			return errors.New("parser bug: cannot read poison")
		}
		handled[e.Payload.Text]++
		return nil
	})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(cctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	var dl []deadletter.Entry
	WaitFor(t, f.Timeout, "the poison event to be dead-lettered", func() bool {
		dl, err = f.DeadLetters.List(ctx, deadletter.Filter{Status: deadletter.StatusPending, Consumer: "replay"})
		if err != nil {
			t.Fatal(err)
		}
		return len(dl) == 1
	})
	mu.Lock()
	if handled["fine"] != 1 {
		t.Errorf("the good event was handled %d times while the poison one failed, want 1", handled["fine"])
	}
	if len(attempts) != maxAttempts || attempts[0] != 1 || attempts[maxAttempts-1] != maxAttempts {
		t.Errorf("the broker counted attempts %v, want 1..%d", attempts, maxAttempts)
	}
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap < f.RetryBackoff/2 {
			t.Errorf("attempt %d came %v after the previous one, sooner than the backoff (%v at least)", i+1, gap, f.RetryBackoff/2)
		}
	}
	broken = false // the fix is deployed
	mu.Unlock()
	e := dl[0]
	if e.Message.ID != poison.ID || e.Attempts != maxAttempts || e.Stage != deadletter.StageConsumer ||
		!strings.Contains(e.Reason, "parser bug") {
		t.Fatalf("dead letter %+v", e)
	}

	if err := f.DeadLetters.Replay(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	relayOnce(1)
	WaitFor(t, f.Timeout, "the replayed event to be handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["poison"] == 1
	})
	got, err := f.DeadLetters.Get(ctx, e.ID)
	if err != nil || got.Status != deadletter.StatusReplayed {
		t.Fatalf("after replay the dead letter is %+v (%v), want status replayed", got.Status, err)
	}
}
