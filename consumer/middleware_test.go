package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
)

type tenantKey struct{}

// TestMiddlewareWrapsEveryHandler: middleware run first-outermost around every handler,
// may change its context and its error, and a middleware's panic is a permanent error like
// a handler's.
func TestMiddlewareWrapsEveryHandler(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		trail []string
	)
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		trail = append(trail, s)
	}
	named := func(name string) consumer.Middleware {
		return func(next consumer.MessageHandler) consumer.MessageHandler {
			return func(ctx context.Context, m outbox.Message) error {
				note(name + " before " + m.Type)
				err := next(context.WithValue(ctx, tenantKey{}, name), m)
				note(name + " after")
				return err
			}
		}
	}
	panics := func(next consumer.MessageHandler) consumer.MessageHandler {
		return func(ctx context.Context, m outbox.Message) error {
			if m.Type == "orders.unhandled" {
				panic("middleware bug")
			}
			return next(ctx, m)
		}
	}
	h := newHarness(t, nil, consumer.Config{Middleware: []consumer.Middleware{named("outer"), named("inner"), panics}})
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		note("handler sees tenant " + ctx.Value(tenantKey{}).(string))
		return nil
	})
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Unhandled]) error { return nil })
	h.run(t)
	h.send(t, outbox.New(Paid{Order: 1}))
	outboxtest.WaitFor(t, 5*time.Second, "the handler", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(trail) == 5
	})
	want := []string{"outer before orders.paid", "inner before orders.paid", "handler sees tenant inner", "inner after", "outer after"}
	mu.Lock()
	if !slices.Equal(trail, want) {
		t.Errorf("trail %q, want %q", trail, want)
	}
	mu.Unlock()
	h.send(t, outbox.New(Unhandled{}))
	outboxtest.WaitFor(t, 5*time.Second, "the middleware's panic to be dead-lettered", func() bool { return len(h.dlq.Entries()) == 1 })
	if e := h.dlq.Entries()[0]; e.Kind != deadletter.KindPermanent || !strings.Contains(e.Reason, "middleware bug") {
		t.Errorf("dead letter %+v", e)
	}
}

// TestOnDeadLetterOncePerDeadLetter: the consumer's hook fires once for each dead letter it
// stores — malformed, unknown type, permanent, gave up — and not for a write that failed.
func TestOnDeadLetterOncePerDeadLetter(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		hooked []deadletter.Notice
	)
	h := newHarness(t, nil, consumer.Config{MaxAttempts: 2, OnDeadLetter: func(_ context.Context, d deadletter.Notice) {
		mu.Lock()
		defer mu.Unlock()
		hooked = append(hooked, d)
	}})
	consumer.Handle(h.c, func(ctx context.Context, e outbox.Event[Paid]) error {
		if e.Payload.Order == 1 {
			return outbox.Permanent(errors.New("order 1 is void"))
		}
		return errors.New("always fails")
	})
	h.run(t)
	h.send(t, outbox.New(Paid{Order: 1}), outbox.New(Paid{Order: 2}), outbox.New(Unhandled{}))
	outboxtest.WaitFor(t, 5*time.Second, "three dead letters", func() bool { return len(h.dlq.Entries()) == 3 })
	h.stop()
	mu.Lock()
	defer mu.Unlock()
	kinds := map[deadletter.Kind]int{}
	for _, d := range hooked {
		kinds[d.Kind]++
		if d.Stage != "consumer" || d.Consumer != "test" || d.Reason == "" {
			t.Errorf("hook got %+v", d)
		}
	}
	if len(hooked) != 3 || kinds["permanent"] != 1 || kinds["gave-up"] != 1 || kinds["unknown-type"] != 1 {
		t.Errorf("hook fired %d times, by kind %v; want once per dead letter", len(hooked), kinds)
	}
}
