package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// A consumer runs the handler registered for each event type. A handler's error makes the
// broker deliver the message again after a backoff; an outbox.Permanent error (or
// MaxAttempts failures) moves it to the dead-letter table instead. Here the broker is the
// in-memory transport, with per-key order (FIFO), and the three events share a key.
func Example() {
	queue := outboxmemory.New(&outboxmemory.Config{FIFO: true}) // outboxsqs, outboxnats… in production
	deadLettered := make(chan deadletter.Notice, 1)
	c, err := consumer.New(queue, &consumer.Config{
		Name:         "receipts",
		DeadLetters:  &memoryDLQ{}, // the adapter's table in production: outboxpgx.Default.NewDeadLetters(pool)…
		RetryBackoff: time.Millisecond,
		OnDeadLetter: func(_ context.Context, n deadletter.Notice) { deadLettered <- n },
	})
	if err != nil {
		panic(err)
	}
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[Paid]) error {
		info, _ := consumer.InfoFrom(ctx)
		switch {
		case e.Payload.Order < 0:
			return outbox.Permanent(fmt.Errorf("order %d: no such order", e.Payload.Order))
		case e.Payload.Order == 2 && info.Attempt == 1:
			return errors.New("mail server busy") // retried
		}
		fmt.Printf("receipt for order %d (attempt %d)\n", e.Payload.Order, info.Attempt)
		return nil
	})

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	var msgs []outbox.Message // what the relay sends
	for _, order := range []int{1, 2, -3} {
		m, _ := outbox.New(Paid{Order: order}, outbox.WithKey("customer-7")).Encode()
		msgs = append(msgs, m)
	}
	if err := queue.Send(ctx, msgs); err != nil {
		panic(err)
	}

	n := <-deadLettered
	fmt.Printf("dead letter: %s after %d attempt: %s\n", n.Message.Type, n.Attempts, n.Reason)
	stop()
	fmt.Println("Run returned", <-done)
	// Output:
	// receipt for order 1 (attempt 1)
	// receipt for order 2 (attempt 2)
	// dead letter: orders.paid after 1 attempt: order -3: no such order
	// Run returned <nil>
}
