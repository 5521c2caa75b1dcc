package relay_test

import (
	"context"
	"fmt"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

type orderPlaced struct {
	OrderID string `json:"order_id"`
}

func (orderPlaced) EventType() string { return "orders.placed" }

// committedOutbox stands for an adapter's store over an outbox with these events committed
// (outboxpgx.Default.NewStore(pool), outboxsql.SQLite.NewStore(db)…): the relay tests'
// in-memory store, so that the examples need no database.
func committedOutbox(events ...outbox.Encodable) outboxdriver.Store {
	msgs, err := outboxdriver.Encode(context.Background(), events)
	if err != nil {
		panic(err)
	}
	s := newListStore(0)
	for i, m := range msgs {
		s.rows = append(s.rows, &listRow{seq: int64(i + 1), msg: m})
	}
	return s
}

// A relay sends the committed events of an outbox to a broker: here the in-memory
// transport, in production outboxsqs, outboxnats, outboxkafka…. RunOnce claims and sends one
// batch, for a cron job or a test; Run does it until its context ends.
func ExampleNew() {
	store := committedOutbox(
		outbox.New(orderPlaced{OrderID: "o-1"}, outbox.WithKey("o-1")),
		outbox.New(orderPlaced{OrderID: "o-2"}, outbox.WithKey("o-2")),
	)
	broker := outboxmemory.New(nil)
	r, err := relay.New(store, broker, nil) // nil: the documented defaults
	if err != nil {
		panic(err)
	}
	n, err := r.RunOnce(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println("sent", n)
	for _, m := range broker.Sent() {
		fmt.Println(m.Type, m.Key)
	}
	// Output:
	// sent 2
	// orders.placed o-1
	// orders.placed o-2
}

// Run delivers events as they are committed until its context ends, then returns nil.
// In the process that publishes, Wake after a commit sends at once instead of at the next
// poll (at most MaxPollInterval later).
func ExampleRelay_Run() {
	store := committedOutbox(outbox.New(orderPlaced{OrderID: "o-1"}))
	broker := outboxmemory.New(nil)
	r, err := relay.New(store, broker, nil)
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()

	deliveries, err := broker.Receive(ctx, 10) // waits for the relay's send
	if err != nil {
		panic(err)
	}
	m, _ := deliveries[0].Message()
	fmt.Println("received", m.Type)

	stop()
	fmt.Println("Run returned", <-done)
	// Output:
	// received orders.placed
	// Run returned <nil>
}

// A Group runs the relays of many outboxes in one process — schemas of one database, or a
// database per tenant — sharing MaxCycles turns round-robin, so that a busy outbox cannot
// starve a quiet one. Add and Remove work before and while Run runs; State tells each
// outbox's health.
func ExampleGroup() {
	broker := outboxmemory.New(nil)
	g, err := relay.NewGroup(&relay.GroupConfig{MaxCycles: 4})
	if err != nil {
		panic(err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		store := committedOutbox(outbox.New(orderPlaced{OrderID: tenant + "-1"}, outbox.WithKey(tenant)))
		if err := g.Add(relay.Outbox{Name: tenant, Store: store, Sender: broker}); err != nil {
			panic(err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Run(ctx) }()

	got := map[string]bool{}
	for len(got) < 2 {
		deliveries, err := broker.Receive(ctx, 10)
		if err != nil {
			panic(err)
		}
		for _, d := range deliveries {
			m, _ := d.Message()
			got[m.Key] = true
		}
	}
	fmt.Println("delivered for", len(got), "tenants")
	s, _ := g.State("acme")
	fmt.Println("acme healthy:", s.Healthy())

	if err := g.Remove(ctx, "globex"); err != nil { // its relay has stopped when Remove returns
		panic(err)
	}
	fmt.Println("serving", g.Names())
	stop()
	fmt.Println("Run returned", <-done)
	// Output:
	// delivered for 2 tenants
	// acme healthy: true
	// serving [acme]
	// Run returned <nil>
}
