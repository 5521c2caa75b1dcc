package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// dependency stands for a database the handlers need: down, its calls fail with an error
// marked unavailable; up, they succeed and are recorded.
type dependency struct {
	down    atomic.Bool
	failed  atomic.Int64
	mu      sync.Mutex
	handled map[int]int // order → times handled
}

func (d *dependency) call(n int) error {
	if d.down.Load() {
		d.failed.Add(1)
		return outbox.Unavailable(errors.New("connection refused (test)"))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.handled == nil {
		d.handled = map[int]int{}
	}
	d.handled[n]++
	return nil
}

func (d *dependency) times() map[int]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[int]int, len(d.handled))
	for k, v := range d.handled {
		out[k] = v
	}
	return out
}

// stateLog records OnStateChange calls.
type stateLog struct {
	mu     sync.Mutex
	states []consumer.State
}

func (l *stateLog) record(_ context.Context, s consumer.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.states = append(l.states, s)
}

func (l *stateLog) healthy() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []bool
	for _, s := range l.states {
		out = append(out, s.UnavailableSince.IsZero())
	}
	return out
}

// TestUnavailableDependencyPausesAndNeverDeadLetters: while the handlers' database is down,
// every failure is an unavailability: nothing is dead-lettered or acknowledged whatever
// the attempt count (MaxAttempts is 2 and each message is delivered more often), the
// consumer reports itself unavailable and only probes; once the database is back, each
// event is handled exactly once, attempts spent in the outage not counting.
func TestUnavailableDependencyPausesAndNeverDeadLetters(t *testing.T) {
	t.Parallel()
	var db dependency
	db.down.Store(true)
	var states stateLog
	h := newHarness(t, nil, consumer.Config{MaxAttempts: 2, Concurrency: 4,
		UnavailableBackoff: time.Millisecond, MaxUnavailableBackoff: 5 * time.Millisecond, OnStateChange: states.record})
	var failedOwn atomic.Bool // one genuine failure after the outage, past MaxAttempts by the broker's count
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		if e.Payload.Order == 0 && !db.down.Load() && failedOwn.CompareAndSwap(false, true) {
			return errors.New("a failure of its own")
		}
		return db.call(e.Payload.Order)
	})
	const n = 20
	for i := range n {
		h.send(t, outbox.New(Paid{Order: i}, outbox.WithKey(fmt.Sprint("k", i%3))))
	}
	h.run(t)
	outboxtest.WaitFor(t, 10*time.Second, "the consumer to pause and probe a few times", func() bool {
		return !h.c.State().UnavailableSince.IsZero() && db.failed.Load() >= n+5
	})
	if s := h.c.State(); s.Healthy() || !s.Running || s.Err == nil {
		t.Fatalf("State during the outage = %+v, want running, unavailable, with the error", s)
	}
	if got := h.q.Len(); got != n {
		t.Fatalf("%d messages left in the queue during the outage, want all %d (none acknowledged)", got, n)
	}
	db.down.Store(false)
	outboxtest.WaitFor(t, 10*time.Second, "every event to be handled", func() bool { return h.q.Len() == 0 })
	if dl := h.dlq.Entries(); len(dl) != 0 {
		t.Fatalf("%d dead letters, want 0: %+v", len(dl), dl[0])
	}
	handled := db.times()
	for i := range n {
		if handled[i] != 1 {
			t.Errorf("event %d handled %d times, want 1", i, handled[i])
		}
	}
	if !h.c.State().Healthy() {
		t.Errorf("State after the outage = %+v, want healthy", h.c.State())
	}
	if got := states.healthy(); len(got) < 2 || got[0] || !got[len(got)-1] {
		t.Errorf("OnStateChange saw healthy = %v, want unavailable first and available last", got)
	}
}

// TestDeadLetterTableDownPausesAndNeverAcks: a poison message whose dead letter cannot be
// written stays in the broker, unacknowledged, and pauses the consumer, for as many
// deliveries as the outage lasts; once the table answers, it is stored once and acked.
func TestDeadLetterTableDownPausesAndNeverAcks(t *testing.T) {
	t.Parallel()
	q := outboxmemory.New(nil)
	dl := &switchedDLQ{}
	dl.down.Store(true)
	c, err := consumer.New(q, &consumer.Config{Name: "test", DeadLetters: dl, MaxAttempts: 1,
		RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
		UnavailableBackoff: time.Millisecond, MaxUnavailableBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[Paid]) error {
		return outbox.Permanent(errors.New("poison"))
	})
	defer sendAndRun(t, q, c, outbox.New(Paid{Order: 1}))()
	outboxtest.WaitFor(t, 10*time.Second, "several failed writes", func() bool { return dl.failed.Load() >= 5 })
	if s := c.State(); s.UnavailableSince.IsZero() {
		t.Fatalf("State with the dead-letter table down = %+v, want unavailable", s)
	}
	if q.Len() != 1 {
		t.Fatalf("the message left the queue before its dead letter was stored")
	}
	dl.down.Store(false)
	outboxtest.WaitFor(t, 10*time.Second, "the message to be dead-lettered and acked", func() bool { return q.Len() == 0 })
	if got := dl.Entries(); len(got) != 1 || got[0].Kind != deadletter.KindPermanent {
		t.Fatalf("dead letters %+v, want the one permanent failure", got)
	}
	outboxtest.WaitFor(t, 10*time.Second, "the consumer to resume", func() bool { return c.State().Healthy() })
}

// switchedDLQ is a dead-letter table that refuses writes while down.
type switchedDLQ struct {
	memoryDLQ
	down   atomic.Bool
	failed atomic.Int64
}

func (q *switchedDLQ) Add(ctx context.Context, e deadletter.Entry) error {
	if q.down.Load() {
		q.failed.Add(1)
		return errors.New("dial tcp 127.0.0.1:5432: connect: connection refused (test)")
	}
	return q.memoryDLQ.Add(ctx, e)
}

// TestUnknownTypePolicies: an event type with no handler is dead-lettered (the default),
// acknowledged without a dead letter, or retried until a handler exists, never
// dead-lettered, however often it is delivered.
func TestUnknownTypePolicies(t *testing.T) {
	t.Parallel()
	for _, policy := range []consumer.UnknownTypePolicy{consumer.DeadLetterUnknownTypes, consumer.AcknowledgeUnknownTypes, consumer.RetryUnknownTypes} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			q := outboxmemory.New(nil)
			r := &countingReceiver{Receiver: q, typ: "orders.unhandled"}
			dlq := &memoryDLQ{}
			c, err := consumer.New(r, &consumer.Config{Name: "test", DeadLetters: dlq, MaxAttempts: 2, UnknownTypes: policy,
				RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			var handled atomic.Int64
			consumer.Handle(c, func(ctx context.Context, e outbox.Event[Paid]) error {
				handled.Add(1)
				return nil
			})
			defer sendAndRun(t, q, c, outbox.New(Unhandled{}), outbox.New(Paid{Order: 1}))()
			outboxtest.WaitFor(t, 10*time.Second, "the known type to be handled", func() bool { return handled.Load() == 1 })
			switch policy {
			case consumer.DeadLetterUnknownTypes:
				outboxtest.WaitFor(t, 10*time.Second, "the queue to empty", func() bool { return q.Len() == 0 })
				if dl := dlq.Entries(); len(dl) != 1 || dl[0].Kind != deadletter.KindUnknownType {
					t.Fatalf("dead letters %+v, want one unknown-type", dl)
				}
			case consumer.AcknowledgeUnknownTypes:
				outboxtest.WaitFor(t, 10*time.Second, "the queue to empty", func() bool { return q.Len() == 0 })
				if dl := dlq.Entries(); len(dl) != 0 {
					t.Fatalf("dead letters %+v, want none", dl)
				}
			case consumer.RetryUnknownTypes:
				outboxtest.WaitFor(t, 10*time.Second, "the unknown type to be delivered past MaxAttempts", func() bool { return r.count.Load() >= 5 })
				if dl := dlq.Entries(); len(dl) != 0 || q.Len() != 1 {
					t.Fatalf("dead letters %+v and %d queued, want none and the unknown type waiting", dl, q.Len())
				}
			}
		})
	}
}

// countingReceiver counts the deliveries of one event type.
type countingReceiver struct {
	outbox.Receiver
	typ   string
	count atomic.Int64
}

func (r *countingReceiver) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	ds, err := r.Receiver.Receive(ctx, max)
	for _, d := range ds {
		if m, err := d.Message(); err == nil && m.Type == r.typ {
			r.count.Add(1)
		}
	}
	return ds, err
}

// sendAndRun sends events to q, one by one in order, runs c, and returns its stop.
func sendAndRun(t *testing.T, q *outboxmemory.Queue, c *consumer.Consumer, events ...outbox.Encodable) (stop func()) {
	t.Helper()
	for _, e := range events {
		m, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Send(context.Background(), []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
