package outboxazqueue_test

import (
	"context"
	"log"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/internal/backoff"
	"github.com/txoutbox/outbox/relay"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// Relay a PostgreSQL outbox to Azure Queue Storage: parse requests to their own queue,
// everything else to a default one.
func ExampleNewSender() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	client, err := azqueue.NewServiceClientFromConnectionString("UseDevelopmentStorage=true", nil)
	if err != nil {
		log.Fatal(err)
	}
	sender, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{
		DefaultQueue: "events",
		Routes:       map[string]string{"files.parse_requested": "file-parsing"},
	})
	if err != nil {
		log.Fatal(err) // every configuration problem at once
	}
	if err := sender.CreateQueues(ctx); err != nil {
		log.Fatal(err)
	}
	store, err := outboxpgx.Default.NewStore(pool)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(store, sender, nil)
	if err != nil {
		log.Fatal(err)
	}
	go r.Run(ctx)
}

// Receive events from one queue, handle them, and acknowledge or retry each.
func ExampleNewReceiver() {
	ctx := context.Background()
	queue, err := azqueue.NewQueueClientFromConnectionString("UseDevelopmentStorage=true", "file-parsing", nil)
	if err != nil {
		log.Fatal(err)
	}
	receiver, err := outboxazqueue.NewReceiver(queue, &outboxazqueue.ReceiverConfig{VisibilityTimeout: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	for ctx.Err() == nil {
		deliveries, err := receiver.Receive(ctx, 32)
		if err != nil {
			log.Print(err)
			continue
		}
		for _, d := range deliveries {
			m, err := d.Message()
			if err != nil { // not a txoutbox CloudEvent: record it, then drop it
				log.Printf("dropping malformed message: %v", err)
				_ = d.Ack(ctx)
				continue
			}
			if err := handle(ctx, m); err != nil {
				_ = d.Nack(ctx, backoff.Delay(d.Attempt(), time.Second, time.Minute))
				continue
			}
			_ = d.Ack(ctx)
		}
	}
}

func handle(context.Context, outbox.Message) error { return nil }
