package outboxmemory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/txoutbox/outbox"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

type cartAbandoned struct {
	CartID string `json:"cart_id"`
}

func (cartAbandoned) EventType() string { return "carts.abandoned" }

// A Queue is the relay's Sender and a consumer's Receiver at once. Here it is driven by
// hand, as a broker would be: sent messages are received, a nacked one comes back with its
// attempt counted, and a copy of an accepted message is dropped by the dedup window.
func ExampleNew() {
	ctx := context.Background()
	q := outboxmemory.New(&outboxmemory.Config{Name: "carts", FIFO: true, DedupWindow: time.Minute})

	first, _ := outbox.New(cartAbandoned{CartID: "c-1"}, outbox.WithKey("c-1")).Encode()
	second, _ := outbox.New(cartAbandoned{CartID: "c-2"}, outbox.WithKey("c-2")).Encode()
	if err := q.Send(ctx, []outbox.Message{first, second, first}); err != nil { // the relay's side
		panic(err)
	}
	fmt.Println("accepted:", len(q.Sent()))

	deliveries, err := q.Receive(ctx, 10) // the consumer's side
	if err != nil {
		panic(err)
	}
	for _, d := range deliveries {
		m, _ := d.Message()
		e, _ := outbox.Decode[cartAbandoned](m)
		if e.Payload.CartID == "c-1" {
			_ = d.Nack(ctx, 0) // a failed handler: deliver again
			continue
		}
		fmt.Println("handled", e.Payload.CartID, "attempt", d.Attempt())
		_ = d.Ack(ctx)
	}

	again, _ := q.Receive(ctx, 10)
	m, _ := again[0].Message()
	fmt.Println("redelivered", m.Key, "attempt", again[0].Attempt())
	_ = again[0].Ack(ctx)
	fmt.Println("left:", q.Len())
	// Output:
	// accepted: 2
	// handled c-2 attempt 1
	// redelivered c-1 attempt 2
	// left: 0
}
