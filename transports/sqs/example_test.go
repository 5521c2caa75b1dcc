package outboxsqs_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/relay"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// The relay side: events committed to a PostgreSQL outbox go to SQS, orders to a FIFO
// queue in per-order sequence, audit events to a standard queue of their own.
func ExampleNewSender() {
	ctx := context.Background()
	// In an application: cfg, _ := config.LoadDefaultConfig(ctx); client := sqs.NewFromConfig(cfg)
	client := sqs.New(sqs.Options{Region: "us-east-1"})
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	sender, err := outboxsqs.NewSender(client, &outboxsqs.SenderConfig{
		QueueURL: "https://sqs.us-east-1.amazonaws.com/123456789012/orders.fifo",
		Routes: map[string]string{
			"audit.logged": "https://sqs.us-east-1.amazonaws.com/123456789012/audit",
		},
	})
	if err != nil {
		log.Fatal(err) // every problem of the config at once
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

	// Elsewhere, in the transaction that completes the order:
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// ... UPDATE orders SET status = 'completed' ...
	if err := outboxpgx.Default.Publish(ctx, tx, outbox.New(OrderCompleted{Order: "o-42"}, outbox.WithKey("o-42"))); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	r.Wake() // same process: deliver now rather than at the next poll
}

// The consumer side: receive, decode by type, ack what was handled and nack the rest for a
// later attempt.
func ExampleNewReceiver() {
	ctx := context.Background()
	client := sqs.New(sqs.Options{Region: "us-east-1", Credentials: aws.AnonymousCredentials{}})
	receiver, err := outboxsqs.NewReceiver(client, &outboxsqs.ReceiverConfig{
		QueueURL: "https://sqs.us-east-1.amazonaws.com/123456789012/orders.fifo",
		// WaitTime defaults to 20s, SQS's longest long poll.
		VisibilityTimeout: time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	for ctx.Err() == nil {
		deliveries, err := receiver.Receive(ctx, 10)
		if err != nil {
			log.Print(err)
			continue
		}
		for _, d := range deliveries {
			m, err := d.Message()
			if errors.Is(err, outbox.ErrMalformed) {
				log.Printf("not one of ours, dropping: %v", err) // or dead-letter it
				_ = d.Ack(ctx)
				continue
			}
			e, err := outbox.Decode[OrderCompleted](m)
			if err != nil {
				log.Print(err)
				_ = d.Nack(ctx, time.Duration(d.Attempt())*time.Second)
				continue
			}
			log.Printf("order %s completed (attempt %d)", e.Payload.Order, d.Attempt())
			_ = d.Ack(ctx)
		}
	}
}
