package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type Paid struct {
	Order int `json:"order"`
}

func (Paid) EventType() string { return "orders.paid" }

type Unhandled struct{}

func (Unhandled) EventType() string { return "orders.unhandled" }

// memoryDLQ collects dead letters; the SQL tables are tested with each adapter.
type memoryDLQ = outboxtest.DeadLetters

type harness struct {
	q    *outboxmemory.Queue
	dlq  *memoryDLQ
	c    *consumer.Consumer
	stop func()
}

func newHarness(t *testing.T, qcfg *outboxmemory.Config, cfg consumer.Config) *harness {
	t.Helper()
	h := &harness{q: outboxmemory.New(qcfg), dlq: &memoryDLQ{}}
	cfg.Name = "test"
	cfg.DeadLetters = h.dlq
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff, cfg.MaxRetryBackoff = time.Millisecond, 2*time.Millisecond
	}
	c, err := consumer.New(h.q, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	return h
}

func (h *harness) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.c.Run(ctx) }()
	h.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() {
		if ctx.Err() == nil {
			h.stop()
		}
	})
}

func (h *harness) send(t *testing.T, events ...outbox.Encodable) {
	t.Helper()
	for _, e := range events {
		m, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := h.q.Send(context.Background(), []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPoisonNeverBlocksOthers(t *testing.T) {
	h := newHarness(t, nil, consumer.Config{Concurrency: 2})
	var mu sync.Mutex
	handled := map[int]int{}
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		if info, ok := consumer.InfoFrom(ctx); !ok || info.Consumer != "test" {
			t.Errorf("handler context lacks consumer info: %+v", info)
		}
		mu.Lock()
		defer mu.Unlock()
		handled[e.Payload.Order]++
		return nil
	})
	undecodable, _ := outbox.New(Paid{}).Encode()
	undecodable.Body = []byte("{oops")
	h.send(t, outbox.New(Unhandled{}), undecodable)
	for i := range 20 {
		h.send(t, outbox.New(Paid{Order: i}))
	}
	h.run(t)
	outboxtest.WaitFor(t, 10*time.Second, "all messages to be settled", func() bool { return h.q.Len() == 0 })
	mu.Lock()
	if len(handled) != 20 {
		t.Fatalf("handled %d events, want 20", len(handled))
	}
	mu.Unlock()
	dl := h.dlq.Entries()
	if len(dl) != 2 {
		t.Fatalf("dead letters: %+v", dl)
	}
	for _, e := range dl {
		if e.Attempts != 1 || e.Stage != deadletter.StageConsumer || e.Consumer != "test" {
			t.Errorf("dead letter %+v: want attempt 1, stage consumer", e)
		}
	}
	reasons := dl[0].Reason + " | " + dl[1].Reason
	for _, want := range []string{`no handler for event type "orders.unhandled"`, "decoding event"} {
		if !contains(reasons, want) {
			t.Errorf("reasons %q lack %q", reasons, want)
		}
	}
}

func TestRetryThenSuccess(t *testing.T) {
	h := newHarness(t, nil, consumer.Config{})
	var mu sync.Mutex
	attempts := 0
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts < 3 {
			return errors.New("downstream unavailable")
		}
		return nil
	})
	h.send(t, outbox.New(Paid{1}))
	h.run(t)
	outboxtest.WaitFor(t, 10*time.Second, "the message to be acknowledged", func() bool { return h.q.Len() == 0 })
	if attempts != 3 || len(h.dlq.Entries()) != 0 {
		t.Fatalf("attempts %d, dead letters %d; want 3 and 0", attempts, len(h.dlq.Entries()))
	}
}

func TestMaxAttemptsAndPermanent(t *testing.T) {
	h := newHarness(t, nil, consumer.Config{MaxAttempts: 4})
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		if e.Payload.Order == 1 {
			return outbox.Permanent(errors.New("order 1 is invalid"))
		}
		if e.Payload.Order == 2 {
			panic("handler bug")
		}
		return fmt.Errorf("order %d: still failing", e.Payload.Order)
	})
	h.send(t, outbox.New(Paid{1}), outbox.New(Paid{2}), outbox.New(Paid{3}))
	h.run(t)
	outboxtest.WaitFor(t, 10*time.Second, "three dead letters", func() bool { return len(h.dlq.Entries()) == 3 })
	outboxtest.WaitFor(t, 10*time.Second, "the queue to empty", func() bool { return h.q.Len() == 0 })
	byOrder := map[string]deadletter.Entry{}
	for _, e := range h.dlq.Entries() {
		byOrder[string(e.Message.Body)] = e
	}
	if e := byOrder[`{"order":1}`]; e.Attempts != 1 || e.Reason != "order 1 is invalid" {
		t.Errorf("permanent: %+v", e)
	}
	if e := byOrder[`{"order":2}`]; e.Attempts != 1 || !contains(e.Reason, "panicked") {
		t.Errorf("panic: %+v", e)
	}
	if e := byOrder[`{"order":3}`]; e.Attempts != 4 || !contains(e.Reason, "gave up after 4 attempts") {
		t.Errorf("exhausted: %+v", e)
	}
}

func TestPerKeyOrder(t *testing.T) {
	h := newHarness(t, nil, consumer.Config{Concurrency: 8, BatchSize: 10})
	var mu sync.Mutex
	seen := map[string][]int{}
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		time.Sleep(time.Millisecond) // let other keys interleave
		mu.Lock()
		defer mu.Unlock()
		seen[e.Key] = append(seen[e.Key], e.Payload.Order)
		return nil
	})
	for i := range 30 {
		h.send(t, outbox.New(Paid{i}, outbox.WithKey(fmt.Sprint("k", i%3))))
	}
	h.run(t)
	outboxtest.WaitFor(t, 10*time.Second, "all handled", func() bool { return h.q.Len() == 0 })
	mu.Lock()
	defer mu.Unlock()
	for k, orders := range seen {
		for i := 1; i < len(orders); i++ {
			if orders[i] < orders[i-1] {
				t.Fatalf("key %s handled out of order: %v", k, orders)
			}
		}
	}
}

// TestConcurrencyCapsHandlersInFlight: with Concurrency 4 and 20 blocked handlers, exactly 4
// run at once, keyless or keyed; releasing one lets exactly one more start.
func TestConcurrencyCapsHandlersInFlight(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			t.Parallel()
			const limit, n = 4, 20
			h := newHarness(t, nil, consumer.Config{Concurrency: limit, BatchSize: n})
			var (
				mu            sync.Mutex
				running, peak int
				started       int
			)
			release := make(chan struct{})
			consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
				mu.Lock()
				running++
				started++
				peak = max(peak, running)
				mu.Unlock()
				<-release
				mu.Lock()
				running--
				mu.Unlock()
				return nil
			})
			for i := range n {
				var opts []outbox.Option
				if keyed { // 10 keys of two events: the second waits for the first, holding a slot
					opts = append(opts, outbox.WithKey(fmt.Sprint("k", i%10)))
				}
				h.send(t, outbox.New(Paid{i}, opts...))
			}
			h.run(t)
			releaseAll := sync.OnceFunc(func() { close(release) })
			t.Cleanup(releaseAll) // before the harness stops the consumer, if the test failed
			startedNow := func() int { mu.Lock(); defer mu.Unlock(); return started }
			outboxtest.WaitFor(t, 10*time.Second, "the first handlers to start", func() bool { return startedNow() == limit })
			for want := limit + 1; want <= n; want++ {
				release <- struct{}{}
				outboxtest.WaitFor(t, 10*time.Second, "the next handler to start", func() bool { return startedNow() >= want })
			}
			releaseAll()
			outboxtest.WaitFor(t, 10*time.Second, "all acknowledged", func() bool { return h.q.Len() == 0 })
			mu.Lock()
			defer mu.Unlock()
			if peak != limit || started != n {
				t.Fatalf("%d handlers ran at once at most (want %d), %d ran (want %d)", peak, limit, started, n)
			}
		})
	}
}

func TestShutdownFinishesInFlightAndNeverAcksUnfinished(t *testing.T) {
	h := newHarness(t, nil, consumer.Config{ShutdownTimeout: 200 * time.Millisecond})
	started := make(chan int, 2)
	release := make(chan struct{})
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		started <- e.Payload.Order
		if e.Payload.Order == 1 { // finishes after shutdown began
			<-release
			return nil
		}
		<-ctx.Done() // never finishes on its own: interrupted at ShutdownTimeout
		return ctx.Err()
	})
	h.send(t, outbox.New(Paid{1}), outbox.New(Paid{2}))
	h.run(t)
	<-started
	<-started
	stopped := make(chan struct{})
	go func() { h.stop(); close(stopped) }()
	close(release)
	<-stopped
	if n := h.q.Len(); n != 1 {
		t.Fatalf("%d messages left unacknowledged, want 1 (the interrupted one)", n)
	}
	if len(h.dlq.Entries()) != 0 {
		t.Fatal("an interrupted message was dead-lettered")
	}
}

func TestConfigValidation(t *testing.T) {
	_, err := consumer.New(outboxmemory.New(nil), &consumer.Config{Concurrency: -1})
	for _, want := range []string{"Name is required", "DeadLetters is required", "Concurrency"} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// TestConfigWithDefaults: nil and the zero Config get the documented defaults, set fields
// are kept, and the copy shares no slice with the original.
func TestConfigWithDefaults(t *testing.T) {
	for _, c := range []*consumer.Config{nil, {}} {
		d := c.WithDefaults()
		if d.Concurrency != 10 || d.BatchSize != 10 || d.MaxAttempts != 10 || d.RetryBackoff != time.Second ||
			d.MaxRetryBackoff != 5*time.Minute || d.ShutdownTimeout != 30*time.Second || d.AckTimeout != 5*time.Second ||
			d.UnavailableBackoff != 100*time.Millisecond || d.MaxUnavailableBackoff != 10*time.Second || d.Logger == nil {
			t.Errorf("WithDefaults of %+v = %+v, not the documented defaults", c, d)
		}
	}
	mw := func(h consumer.MessageHandler) consumer.MessageHandler { return h }
	c := &consumer.Config{Concurrency: 3, Middleware: []consumer.Middleware{mw}}
	d := c.WithDefaults()
	d.Middleware[0] = nil
	if d.Concurrency != 3 || c.Middleware[0] == nil {
		t.Errorf("WithDefaults changed a set field or shares Middleware with the original")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// hangingAck is a receiver whose first delivery's Ack never answers, like a broker whose
// connection died: it returns only when its context ends.
type hangingAck struct {
	outbox.Receiver
	once     sync.Once
	mu       sync.Mutex
	ackErr   error
	returned bool
}

func (r *hangingAck) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	ds, err := r.Receiver.Receive(ctx, limit)
	for i := range ds {
		r.once.Do(func() { ds[i] = hangingDelivery{ds[i], r} })
	}
	return ds, err
}

func (r *hangingAck) result() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.returned, r.ackErr
}

type hangingDelivery struct {
	outbox.Delivery
	r *hangingAck
}

func (d hangingDelivery) Ack(ctx context.Context) error {
	<-ctx.Done()
	d.r.mu.Lock()
	d.r.returned, d.r.ackErr = true, ctx.Err()
	d.r.mu.Unlock()
	return ctx.Err()
}

// TestAckTimeoutFreesTheKey: an Ack that never answers holds its slot and its key only for
// AckTimeout; then the key's next event is handled.
func TestAckTimeoutFreesTheKey(t *testing.T) {
	q := outboxmemory.New(nil)
	r := &hangingAck{Receiver: q}
	c, err := consumer.New(r, &consumer.Config{
		Name: "test", DeadLetters: &memoryDLQ{}, Concurrency: 1,
		AckTimeout: 50 * time.Millisecond, ShutdownTimeout: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var handled []int
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[Paid]) error {
		mu.Lock()
		handled = append(handled, e.Payload.Order)
		mu.Unlock()
		return nil
	})
	stop := sendAndRun(t, q, c, outbox.New(Paid{1}, outbox.WithKey("k")), outbox.New(Paid{2}, outbox.WithKey("k")))
	outboxtest.WaitFor(t, 10*time.Second, "the key's second event to be handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(handled, 2)
	})
	stop()
	if returned, err := r.result(); !returned || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the hanging Ack returned %v with %v, want context.DeadlineExceeded after AckTimeout", returned, err)
	}
}

// PaidPtr has a value-receiver EventType; handlers may take it by pointer.
type PaidPtr struct {
	Order int `json:"order"`
}

func (PaidPtr) EventType() string { return "orders.paid_ptr" }

// TestPointerPayloadHandler: Handle[*T] for a T with a value-receiver EventType registers
// and decodes instead of panicking on a nil *T.
func TestPointerPayloadHandler(t *testing.T) {
	h := newHarness(t, nil, consumer.Config{})
	got := make(chan int, 1)
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[*PaidPtr]) error {
		got <- e.Payload.Order
		return nil
	})
	h.send(t, outbox.New(&PaidPtr{Order: 7}))
	h.run(t)
	select {
	case n := <-got:
		if n != 7 {
			t.Fatalf("handled order %d, want 7", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the *PaidPtr handler never ran")
	}
}

// flakyDLQ fails its first fails writes, as a dead-letter table that is down would.
type flakyDLQ struct {
	memoryDLQ
	fails int32
	tries atomic.Int32
}

func (q *flakyDLQ) Add(ctx context.Context, e deadletter.Entry) error {
	if q.tries.Add(1) <= q.fails {
		return errors.New("connection refused")
	}
	return q.memoryDLQ.Add(ctx, e)
}

// TestDeadLetterStoreDownIsRetried: while the dead-letter table is unreachable the message
// is nacked and comes back (past MaxAttempts: dropping it would lose it); once the table
// answers, it is stored once and acknowledged.
func TestDeadLetterStoreDownIsRetried(t *testing.T) {
	dlq := &flakyDLQ{fails: 3}
	q := outboxmemory.New(nil)
	c, err := consumer.New(q, &consumer.Config{Name: "test", DeadLetters: dlq, MaxAttempts: 1,
		RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, func(context.Context, outbox.Event[Paid]) error { return nil })
	m, _ := outbox.New(Unhandled{}).Encode()
	if err := q.Send(context.Background(), []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	outboxtest.WaitFor(t, 10*time.Second, "the message to be dead-lettered", func() bool { return q.Len() == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	dl := dlq.Entries()
	if len(dl) != 1 || dl[0].Attempts != 4 || dl[0].Kind != deadletter.KindUnknownType {
		t.Fatalf("dead letters %+v: want one, at the 4th delivery, kind unknown-type", dl)
	}
}

// TestMalformedDeliveryKeepsEvidence: the consumer turns a transport's MalformedError into a
// dead letter with the broker's message ID, the attributes and body as received, and what
// could be read; it acknowledges the message.
func TestMalformedDeliveryKeepsEvidence(t *testing.T) {
	dlq := &memoryDLQ{}
	me := &outbox.MalformedError{
		Partial:         outbox.Message{Type: "orders.paid", Key: "k"},
		BrokerMessageID: "m-1",
		Attributes:      map[string]string{"ce-id": "nope"},
		Body:            []byte("{raw"),
		Err:             errors.New("ce-id is not a UUID"),
	}
	r := &oneDelivery{err: me}
	c, err := consumer.New(r, &consumer.Config{Name: "test", DeadLetters: dlq})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, func(context.Context, outbox.Event[Paid]) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	outboxtest.WaitFor(t, 10*time.Second, "the delivery to be settled", r.settled)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	dl := dlq.Entries()
	if len(dl) != 1 {
		t.Fatalf("%d dead letters", len(dl))
	}
	e := dl[0]
	if e.Kind != deadletter.KindMalformed || e.BrokerMessageID != "m-1" || e.Message.Type != "orders.paid" ||
		e.Raw == nil || e.Raw.Attributes["ce-id"] != "nope" || string(e.Raw.Body) != "{raw" || !r.acked {
		t.Fatalf("dead letter %+v (raw %+v), acked %v", e, e.Raw, r.acked)
	}
}

// oneDelivery delivers one message whose Message fails with err.
type oneDelivery struct {
	mu          sync.Mutex
	err         error
	sent, acked bool
	nacked      bool
}

func (r *oneDelivery) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	r.mu.Lock()
	if !r.sent {
		r.sent = true
		r.mu.Unlock()
		return []outbox.Delivery{r}, nil
	}
	r.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (r *oneDelivery) settled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acked || r.nacked
}

func (r *oneDelivery) Message() (outbox.Message, error) { return outbox.Message{}, r.err }
func (r *oneDelivery) Attempt() int                     { return 1 }
func (r *oneDelivery) Ack(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acked = true
	return nil
}

func (r *oneDelivery) Nack(context.Context, time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nacked = true
	return nil
}

// kindedError names its dead-letter kind (deadletter.Classified).
type kindedError struct{}

func (kindedError) Error() string                   { return "blob gone" }
func (kindedError) DeadLetterKind() deadletter.Kind { return deadletter.KindBlobMissing }

// TestClassifiedKind: a permanent error that names its kind is dead-lettered with it; an
// unnamed one stays "permanent".
func TestClassifiedKind(t *testing.T) {
	h := newHarness(t, nil, consumer.Config{})
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		if e.Payload.Order == 1 {
			return outbox.Permanent(fmt.Errorf("order 1: %w", kindedError{}))
		}
		return outbox.Permanent(errors.New("order 2 is invalid"))
	})
	h.send(t, outbox.New(Paid{1}), outbox.New(Paid{2}))
	h.run(t)
	outboxtest.WaitFor(t, 10*time.Second, "two dead letters", func() bool { return len(h.dlq.Entries()) == 2 })
	kinds := map[string]deadletter.Kind{}
	for _, e := range h.dlq.Entries() {
		kinds[string(e.Message.Body)] = e.Kind
	}
	if kinds[`{"order":1}`] != deadletter.KindBlobMissing || kinds[`{"order":2}`] != deadletter.KindPermanent {
		t.Fatalf("kinds %v, want blob-missing for the classified error and permanent for the other", kinds)
	}
}
