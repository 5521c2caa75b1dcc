package idempotency_test

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

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/outboxtest"
)

type step struct{ N int }

func (step) EventType() string { return "test.step" }

// memInbox is an Inbox in memory that records the size of every batch (RecordMany) and
// lone event (Record); the SQL inboxes are tested with each adapter.
type memInbox struct {
	idempotency.Inbox[struct{}] // the methods the group does not call

	mu      sync.Mutex
	seen    map[idempotency.Key]bool
	batches []int // keys per RecordMany, 1 per Record
}

func (m *memInbox) InTx(_ context.Context, fn func(struct{}) error) error { return fn(struct{}{}) }

func (m *memInbox) Record(ctx context.Context, tx struct{}, k idempotency.Key) (bool, error) {
	fresh, err := m.RecordMany(ctx, tx, []idempotency.Key{k})
	return fresh[0], err
}

func (m *memInbox) RecordMany(_ context.Context, _ struct{}, keys []idempotency.Key) ([]bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches = append(m.batches, len(keys))
	fresh := make([]bool, len(keys))
	for i, k := range keys {
		fresh[i] = !m.seen[k]
		m.seen[k] = true
	}
	return fresh, nil
}

func (m *memInbox) sizes() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.batches)
}

// TestGroupWaitsUntilABatchIsWorthATransaction: with two transactions allowed, a batch
// starts next to a running one only once as many events wait as the running batch holds:
// while a batch of 3 runs, the next 3 events go together, where starting at once would
// have sent the first alone. An idle group starts at once, even for one event.
func TestGroupWaitsUntilABatchIsWorthATransaction(t *testing.T) {
	t.Parallel()
	in := &memInbox{seen: map[idempotency.Key]bool{}}
	var (
		mu      sync.Mutex
		gates   = map[int]chan struct{}{}
		entered = map[int]bool{}
	)
	gate := func(n int) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if gates[n] == nil {
			gates[n] = make(chan struct{})
		}
		return gates[n]
	}
	g := idempotency.NewGroup[struct{}, step](in, func(ctx context.Context, _ struct{}, e outbox.Event[step]) error {
		mu.Lock()
		entered[e.Payload.N] = true
		mu.Unlock()
		select {
		case <-gate(e.Payload.N):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, &idempotency.GroupConfig{MaxTransactions: 2})
	ctx, cancel := context.WithCancel(consumer.WithInfo(context.Background(), consumer.Info{Consumer: "c", Attempt: 1}))
	t.Cleanup(cancel) // a failed test must not leave calls blocked
	results := map[int]chan error{}
	call := func(n int) {
		result := make(chan error, 1)
		results[n] = result
		go func() { result <- g.Handle(ctx, outbox.New(step{n})) }()
	}
	// release lets the handlers of ns return (a batch's run one after another), and waits
	// for their calls.
	release := func(ns ...int) {
		for _, n := range ns {
			close(gate(n))
		}
		for _, n := range ns {
			if err := <-results[n]; err != nil {
				t.Fatalf("event %d: %v", n, err)
			}
		}
	}
	// handling reports whether the handler of one of ns has started (the goroutines of
	// calls made together enqueue in any order).
	handling := func(ns ...int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.ContainsFunc(ns, func(n int) bool { return entered[n] })
		}
	}
	waiting := func(n int) func() bool { return func() bool { return g.Waiting() == n } }
	const wait = 10 * time.Second

	call(1) // idle: starts at once, alone
	outboxtest.WaitFor(t, wait, "event 1 to run", handling(1))
	call(2) // a batch of 1 runs: one waiting event is worth a second transaction
	outboxtest.WaitFor(t, wait, "event 2 to run next to 1", handling(2))
	call(3)
	call(4)
	call(5) // both transactions busy: 3, 4, 5 wait
	outboxtest.WaitFor(t, wait, "3, 4 and 5 to wait", waiting(3))
	release(1) // 3, 4, 5 take the free transaction together
	outboxtest.WaitFor(t, wait, "the batch of 3, 4 and 5 to run", handling(3, 4, 5))
	release(2) // now only the batch of 3 runs
	call(6)
	call(7) // 6 and 7 are fewer than the batch running: they wait for a third
	outboxtest.WaitFor(t, wait, "6 and 7 to wait", waiting(2))
	call(8)
	outboxtest.WaitFor(t, wait, "the batch of 6, 7 and 8 to run", handling(6, 7, 8))
	release(3, 4, 5, 6, 7, 8)
	if got, want := in.sizes(), []int{1, 1, 3, 3}; !slices.Equal(got, want) {
		t.Fatalf("batches of %v events, want %v", got, want)
	}
}

// TestGroupMaxEventsOneIsOnce: with MaxEvents 1, every event has a transaction of its own
// and as many run at once as there are calls — MaxTransactions does not cap them: five
// handlers are inside their transactions together although MaxTransactions is 1.
func TestGroupMaxEventsOneIsOnce(t *testing.T) {
	t.Parallel()
	const calls = 5
	in := &memInbox{seen: map[idempotency.Key]bool{}}
	var inside sync.WaitGroup
	inside.Add(calls)
	all := make(chan struct{})
	go func() { inside.Wait(); close(all) }()
	ctx, cancel := context.WithTimeout(consumer.WithInfo(context.Background(), consumer.Info{Consumer: "c", Attempt: 1}), time.Minute)
	defer cancel()
	g := idempotency.NewGroup[struct{}, step](in, func(ctx context.Context, _ struct{}, e outbox.Event[step]) error {
		inside.Done()
		select {
		case <-all: // every handler is running
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, &idempotency.GroupConfig{MaxEvents: 1, MaxTransactions: 1})
	results := make(chan error, calls)
	for n := range calls {
		go func() { results <- g.Handle(ctx, outbox.New(step{n})) }()
	}
	for range calls {
		if err := <-results; err != nil {
			t.Fatalf("an event returned %v, want every handler running at once", err)
		}
	}
	if got, want := in.sizes(), []int{1, 1, 1, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("keys recorded %v at a time, want one by one", got)
	}
}

// slowGroup returns a group over a memory inbox (whose own statements take no time) with
// cfg, whose handler takes 10 ms per event until block is set; then it reports each call
// on inside and waits for release (or its ctx).
func slowGroup(t *testing.T, cfg *idempotency.GroupConfig) (g *idempotency.Group[struct{}, step], ctx context.Context, block *atomic.Bool, inside chan int, release chan struct{}) {
	block, inside, release = &atomic.Bool{}, make(chan int, 100), make(chan struct{})
	g = idempotency.NewGroup[struct{}, step](&memInbox{seen: map[idempotency.Key]bool{}}, func(ctx context.Context, _ struct{}, e outbox.Event[step]) error {
		if !block.Load() {
			time.Sleep(10 * time.Millisecond)
			return nil
		}
		inside <- e.Payload.N
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, cfg)
	ctx, cancel := context.WithTimeout(consumer.WithInfo(context.Background(), consumer.Info{Consumer: "c", Attempt: 1}), time.Minute)
	t.Cleanup(cancel)
	for n := range 10 { // one at a time: transactions all in the handler, none in the inbox
		if err := g.Handle(ctx, outbox.New(step{n})); err != nil {
			t.Fatal(err)
		}
	}
	block.Store(true)
	return g, ctx, block, inside, release
}

// TestGroupSlowHandlersRunSideBySide: with MaxTransactions left to the group, transactions
// that spend their time in handlers rather than in their own statements let more batches
// run at once than the default 2: five slow handlers run together.
func TestGroupSlowHandlersRunSideBySide(t *testing.T) {
	t.Parallel()
	g, ctx, _, inside, release := slowGroup(t, nil)
	results := make(chan error, 5)
	for n := range 5 {
		go func() { results <- g.Handle(ctx, outbox.New(step{100 + n})) }()
		select {
		case <-inside:
		case <-ctx.Done():
			t.Fatalf("event %d waits for a batch (%d waiting), want its handler running next to the %d before it", n, g.Waiting(), n)
		}
	}
	close(release)
	for range 5 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
}

// TestGroupMaxTransactionsSetIsAHardCap: a MaxTransactions that is set caps the batches
// running at once however slow the handlers: with 2, a third event waits.
func TestGroupMaxTransactionsSetIsAHardCap(t *testing.T) {
	t.Parallel()
	g, ctx, _, inside, release := slowGroup(t, &idempotency.GroupConfig{MaxTransactions: 2})
	results := make(chan error, 3)
	for n := range 3 {
		go func() { results <- g.Handle(ctx, outbox.New(step{100 + n})) }()
		if n < 2 {
			<-inside
		}
	}
	outboxtest.WaitFor(t, 10*time.Second, "the third event to wait for a batch", func() bool { return g.Waiting() == 1 })
	close(release)
	for range 3 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
}

// downInbox is an inbox whose database is down: every transaction fails to begin with an
// error marked unavailable, the first only once gate is closed.
type downInbox struct {
	memInbox
	gate chan struct{}
	txs  atomic.Int64
}

func (d *downInbox) InTx(context.Context, func(struct{}) error) error {
	if d.txs.Add(1) == 1 {
		<-d.gate
	}
	return outbox.Unavailable(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused (test)"))
}

// TestGroupUnavailableFailsEveryEventWithoutRetryingAlone: a batch that fails because the
// database is down returns that error to each of its events, marked unavailable, instead
// of trying each again in a transaction of its own (which would fail the same way).
func TestGroupUnavailableFailsEveryEventWithoutRetryingAlone(t *testing.T) {
	t.Parallel()
	in := &downInbox{gate: make(chan struct{})}
	g := idempotency.NewGroup[struct{}, step](in, func(context.Context, struct{}, outbox.Event[step]) error { return nil },
		&idempotency.GroupConfig{MaxTransactions: 1})
	ctx := consumer.WithInfo(context.Background(), consumer.Info{Consumer: "c", Attempt: 1})
	results := make(chan error, 4)
	var wg sync.WaitGroup
	wg.Go(func() { results <- g.Handle(ctx, outbox.New(step{0})) }) // alone, holding the one transaction
	outboxtest.WaitFor(t, 10*time.Second, "the first transaction to begin", func() bool { return in.txs.Load() == 1 })
	for n := range 3 {
		wg.Go(func() { results <- g.Handle(ctx, outbox.New(step{n + 1})) })
	}
	outboxtest.WaitFor(t, 10*time.Second, "three events to wait for a batch", func() bool { return g.Waiting() == 3 })
	close(in.gate)
	wg.Wait()
	close(results)
	for err := range results {
		if !outbox.IsUnavailable(err) {
			t.Errorf("an event returned %v, want the unavailable error", err)
		}
	}
	if got := in.txs.Load(); got != 2 {
		t.Errorf("%d transactions, want 2: the first event's and the batch's, none again per event", got)
	}
}

// TestGroupConfig: nil means the documented defaults, and a negative field panics when the
// group is built, naming every problem.
func TestGroupConfig(t *testing.T) {
	if d := (*idempotency.GroupConfig)(nil).WithDefaults(); d.MaxEvents != 64 || d.MaxTransactions != 2 {
		t.Errorf("defaults %+v, want MaxEvents 64, MaxTransactions 2", d)
	}
	defer func() {
		r := fmt.Sprint(recover())
		if !strings.Contains(r, "MaxEvents -1") || !strings.Contains(r, "MaxTransactions -2") {
			t.Errorf("NewGroup with a negative config: recovered %q, want a panic naming both fields", r)
		}
	}()
	idempotency.NewGroup(&memInbox{}, func(context.Context, struct{}, outbox.Event[step]) error { return nil },
		&idempotency.GroupConfig{MaxEvents: -1, MaxTransactions: -2})
}
