package outboxtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// keyHoldRig is a consumer with HoldKeys over an ordered in-memory queue, fed by a relay
// from the fixture's outbox, whose handler fails the events named "poison" while broken.
type keyHoldRig[TTx any] struct {
	t *testing.T
	f *IdempotencyFixture[TTx]
	q *outboxmemory.Queue
	h consumer.Handler[Note]

	mu      sync.Mutex
	broken  bool
	handled []string // texts, in the order their transactions ran
}

func newKeyHoldRig[TTx any](t *testing.T, f *IdempotencyFixture[TTx]) *keyHoldRig[TTx] {
	r := &keyHoldRig[TTx]{t: t, f: f, q: outboxmemory.New(&outboxmemory.Config{FIFO: true}), broken: true}
	r.h = f.Idempotent(effectOf(f, func(e outbox.Event[Note]) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.broken && e.Payload.Text == "poison" {
			return outbox.Permanent(fmt.Errorf("cannot handle %q", e.Payload.Text))
		}
		r.handled = append(r.handled, e.Payload.Text)
		return nil
	}), nil)
	return r
}

// publish commits events through the fixture's outbox.
func (r *keyHoldRig[TTx]) publish(events ...outbox.Encodable) {
	r.t.Helper()
	ctx := context.Background()
	in := r.f.Inbox
	if err := in.InTx(ctx, func(tx TTx) error { return r.f.Publish(ctx, tx, events...) }); err != nil {
		r.t.Fatal(err)
	}
}

// relay sends what the outbox holds to the queue.
func (r *keyHoldRig[TTx]) relay() {
	r.t.Helper()
	relay, err := relay.New(r.f.Store, r.q, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	for {
		n, err := relay.RunOnce(context.Background())
		if err != nil {
			r.t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// consume runs the consumer until the queue is empty.
func (r *keyHoldRig[TTx]) consume() {
	r.t.Helper()
	c, err := consumer.New(r.q, &consumer.Config{Name: "outboxtest", DeadLetters: r.f.DeadLetters, HoldKeys: true,
		MaxAttempts: 1, Concurrency: 4, RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	if err != nil {
		r.t.Fatal(err)
	}
	consumer.Handle(c, r.h)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- c.Run(ctx) }()
	WaitFor(r.t, 60*time.Second, "the consumer to settle every message", func() bool { return r.q.Len() == 0 })
	cancel()
	if err := <-stopped; err != nil {
		r.t.Fatal(err)
	}
}

// pending returns the consumer's pending dead letters by text, in ID order.
func (r *keyHoldRig[TTx]) pending() ([]string, []deadletter.Entry) {
	r.t.Helper()
	es, err := r.f.DeadLetters.List(context.Background(), deadletter.Filter{Status: deadletter.StatusPending, Consumer: "outboxtest"})
	if err != nil {
		r.t.Fatal(err)
	}
	var texts []string
	for _, e := range es {
		n, err := outbox.Decode[Note](e.Message)
		if err != nil {
			r.t.Fatal(err)
		}
		texts = append(texts, n.Payload.Text)
	}
	return texts, es
}

func (r *keyHoldRig[TTx]) replay(e deadletter.Entry) {
	r.t.Helper()
	if err := r.f.DeadLetters.Replay(context.Background(), e.ID); err != nil {
		r.t.Fatal(err)
	}
}

func (r *keyHoldRig[TTx]) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.handled)
}

// keyHold: a consumer with HoldKeys dead-letters the later events of a key behind its
// first dead letter (kind "held", naming it), other keys going on; replaying the key's
// entries, in any order, handles the key's events in their order; an event published
// while the key was held that reaches the consumer only after the replay (the consumer
// was stopped) is held behind the replayed events, not handled before them.
func keyHold[TTx any](t *testing.T, f *IdempotencyFixture[TTx]) {
	r := newKeyHoldRig(t, f)
	k := outbox.WithKey("acct-1")
	r.publish(outbox.New(Note{Text: "poison"}, k), outbox.New(Note{Text: "2"}, k), outbox.New(Note{Text: "3"}, k),
		outbox.New(Note{Text: "other"}, outbox.WithKey("acct-2")))
	r.relay()
	r.consume()
	texts, entries := r.pending()
	if !slices.Equal(texts, []string{"poison", "2", "3"}) {
		t.Fatalf("pending dead letters %v, want poison, 2, 3", texts)
	}
	for _, e := range entries[1:] {
		if e.Kind != deadletter.KindHeld || !strings.Contains(e.Reason, fmt.Sprintf("dead letter %d ", entries[0].ID)) {
			t.Fatalf("dead letter %+v, want kind held naming dead letter %d", e, entries[0].ID)
		}
	}
	if got := r.order(); !slices.Equal(got, []string{"other"}) {
		t.Fatalf("handled %v, want only the other key's event", got)
	}

	// Fix the handler; replay the last entry first: its event comes back before the
	// others and is held again, keeping its place.
	r.mu.Lock()
	r.broken = false
	r.mu.Unlock()
	r.replay(entries[2])
	r.relay()
	r.consume()
	if texts, _ := r.pending(); !slices.Equal(texts, []string{"poison", "2", "3"}) {
		t.Fatalf("after replaying 3 alone, pending %v, want poison, 2, 3", texts)
	}
	// Now the rest, while the consumer is stopped, and an event published meanwhile (it
	// reached the broker while the key was held, ahead of the replays).
	four := outbox.New(Note{Text: "4"}, k)
	r.publish(four)
	r.relay()
	// The replay must come after event 4's creation by the database's clock too (SQLite's
	// counts milliseconds).
	WaitFor(t, 10*time.Second, "a few milliseconds to pass", func() bool { return time.Since(four.CreatedAt) > 3*time.Millisecond })
	_, entries = r.pending()
	for _, e := range entries {
		r.replay(e)
	}
	r.relay()
	r.consume()
	texts, entries = r.pending()
	if !slices.Equal(texts, []string{"4"}) {
		t.Fatalf("after replaying every entry, pending %v, want 4 (held behind the replayed events)", texts)
	}
	r.replay(entries[0])
	r.relay()
	r.consume()
	if texts, _ := r.pending(); len(texts) != 0 {
		t.Fatalf("pending %v, want none", texts)
	}
	if got := r.order(); !slices.Equal(got, []string{"other", "poison", "2", "3", "4"}) {
		t.Fatalf("handled %v, want other, then the key in order: poison, 2, 3, 4", got)
	}
	expectEffects(t, f, map[string]int{"other": 1, "poison": 1, "2": 1, "3": 1, "4": 1})
	// Released: a new event of the key is handled at once.
	r.publish(outbox.New(Note{Text: "5"}, k))
	r.relay()
	r.consume()
	if texts, _ := r.pending(); len(texts) != 0 || !slices.Contains(r.order(), "5") {
		t.Fatalf("after the key was released: pending %v, handled %v", texts, r.order())
	}
}
