package outboxrabbitmq_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/relay"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// The whole path: events committed to a PostgreSQL outbox are relayed to the topic exchange
// "events", routed by type to the quorum queue "billing", and handled exactly once through
// the inbox.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	broker := outboxrabbitmq.Connection{URL: "amqp://guest:guest@127.0.0.1:5672/"}

	// Usually declared by infrastructure code; Declare suits tests and examples.
	conn, err := amqp.Dial(broker.URL)
	if err != nil {
		log.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := outboxrabbitmq.Declare(ch, outboxrabbitmq.Topology{Queue: "billing", Bindings: []string{"orders.*"}}); err != nil {
		log.Fatal(err)
	}
	_ = conn.Close()

	// Producer side: "orders.placed" events go to exchange "events" with routing key
	// "orders.placed".
	sender, err := outboxrabbitmq.NewSender(broker, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sender.Close()
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

	// Consumer side: failures are retried through the retry queues, then dead-lettered.
	receiver, err := outboxrabbitmq.NewReceiver(broker, &outboxrabbitmq.ReceiverConfig{Queue: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	defer receiver.Close()
	dead, err := outboxpgx.Default.NewDeadLetters(pool)
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(receiver, &consumer.Config{Name: "billing", DeadLetters: dead})
	if err != nil {
		log.Fatal(err)
	}
	consumer.Handle(c, outboxpgx.Idempotent(outboxpgx.Default, pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[orderPlaced]) error {
		_, err := tx.Exec(ctx, "INSERT INTO invoices (order_id) VALUES ($1)", e.Payload.OrderID)
		return err
	}, nil))
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Per-key order through retries: an ordered (single-active-consumer) queue and an ordered
// receiver, one message in flight.
func ExampleTopology_ordered() {
	top := outboxrabbitmq.Topology{Queue: "shipments", Bindings: []string{"orders.#"}, Ordered: true}
	fmt.Println(top.QueueNames())

	broker := outboxrabbitmq.Connection{URL: "amqp://guest:guest@127.0.0.1:5672/"}
	receiver, err := outboxrabbitmq.NewReceiver(broker, &outboxrabbitmq.ReceiverConfig{Queue: top.Queue, Ordered: true})
	if err != nil {
		log.Fatal(err)
	}
	defer receiver.Close()
	// Output:
	// [shipments shipments.retry.1s shipments.retry.5s shipments.retry.30s shipments.retry.2m shipments.retry.10m shipments.retry.1h]
}

// Retry queues: a Nack's delay rounds up to the next retry queue's delay.
func ExampleRetryQueueName() {
	for _, d := range []time.Duration{250 * time.Millisecond, 5 * time.Second, 2 * time.Minute, time.Hour} {
		fmt.Println(outboxrabbitmq.RetryQueueName("billing", d))
	}
	// Output:
	// billing.retry.250ms
	// billing.retry.5s
	// billing.retry.2m
	// billing.retry.1h
}
