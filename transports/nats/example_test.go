package outboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/internal/backoff"
	"github.com/txoutbox/outbox/relay"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// The whole path: events committed to a PostgreSQL outbox are relayed to the JetStream
// stream EVENTS (subjects "events.>"), and a consumer reads them back.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// Usually declared by infrastructure code; Provision suits tests and examples.
	_, consumer, err := outboxnats.Provision(ctx, js, outboxnats.Topology{Stream: "EVENTS", Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}

	// Producer side: "orders.placed" events go to "events.orders.placed".
	sender, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{Stream: "EVENTS"})
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := outboxpgx.Default.NewStore(pool)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(store, sender, nil)
	if err != nil {
		log.Fatal(err)
	}
	go r.Run(ctx)

	// Consumer side.
	receiver, err := outboxnats.NewReceiver(consumer, nil)
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := receiver.Receive(ctx, 100)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range deliveries {
		m, err := d.Message()
		if errors.Is(err, outbox.ErrMalformed) {
			log.Printf("not a txoutbox event, dropping it: %v", err) // or dead-letter it
			_ = d.Ack(ctx)
			continue
		}
		e, err := outbox.Decode[orderPlaced](m)
		if err != nil {
			_ = d.Nack(ctx, backoff.Delay(d.Attempt(), time.Second, time.Minute))
			continue
		}
		fmt.Println("order placed:", e.Payload.OrderID)
		if err := d.Ack(ctx); err != nil {
			log.Print(err) // redelivered after AckWait; an idempotent handler absorbs it
		}
	}
}

// Routing: a few event types to fixed subjects, the rest under a prefix.
func ExampleNewSender_routing() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	sender, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{
		SubjectPrefix: "shop",
		Subjects:      map[string]string{"orders.placed": "orders.v2.placed"},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, typ := range []string{"orders.placed", "carts.abandoned"} {
		subject, _ := sender.SubjectFor(outbox.Message{Type: typ})
		fmt.Println(typ, "→", subject)
	}
}

// A consumer that handles a few of the types on a shared stream receives only those: its
// durable consumer filters on the subjects the Sender publishes them to. (One subject works
// on every nats-server; several need 2.10 or later.)
func ExampleSubjectsFor() {
	// The relay's routing: "events." and the type, one type to a fixed subject.
	routing := &outboxnats.SenderConfig{Subjects: map[string]string{"orders.placed": "orders.v2.placed"}}
	placed, _ := outbox.EventTypeOf[orderPlaced]()
	subjects, err := outboxnats.SubjectsFor(routing, placed, "orders.cancelled")
	if err != nil {
		log.Fatal(err)
	}
	// Then, with a JetStream context:
	//   outboxnats.Provision(ctx, js, outboxnats.Topology{Stream: "EVENTS", Consumer: "billing", FilterSubjects: subjects})
	fmt.Println(subjects)
	// Output: [orders.v2.placed events.orders.cancelled]
}
