// Command orders is an order service whose status changes must reach the loyalty service,
// over an SQS FIFO queue. Each status change is an UPDATE of the order and an
// Outbox.Publish in one *sql.Tx; the relay sends the events to SQS with the order ID as
// MessageGroupId, so each order's events arrive in order; the loyalty service awards points
// through the inbox, so a redelivered "completed" never awards them twice.
//
// It needs PostgreSQL ($TXOUTBOX_PG_URL) and an SQS endpoint ($TXOUTBOX_SQS_ENDPOINT, e.g.
// fauxqs), both defaulting to the local test services.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/relay"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// OrderStatusChanged is published with every status change, keyed by the order ID.
type OrderStatusChanged struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	Status     string `json:"status"` // created, paid, completed
	TotalCents int64  `json:"total_cents"`
}

// EventType names the event on the wire.
func (OrderStatusChanged) EventType() string { return "orders.status_changed" }

type config struct{ PGURL, SQSEndpoint string }

func configFromEnv() config {
	return config{
		PGURL:       envOr("TXOUTBOX_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		SQSEndpoint: envOr("TXOUTBOX_SQS_ENDPOINT", "http://127.0.0.1:4566"),
	}
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, configFromEnv()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, stdout io.Writer, cfg config) error {
	// A fresh schema and queue per run, so runs never meet each other's rows or messages.
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	schema := "orders_" + suffix
	pc, err := pgx.ParseConfig(cfg.PGURL)
	if err != nil {
		return err
	}
	pc.RuntimeParams["search_path"] = schema
	db := stdlib.OpenDB(*pc)
	defer db.Close()
	box, err := outboxsql.New(outboxsql.Postgres, outbox.Tables{Schema: schema})
	if err != nil {
		return err
	}
	if err := box.Migrate(ctx, db); err != nil { // creates the schema too
		return err
	}
	defer db.Exec("DROP SCHEMA " + schema + " CASCADE")
	// orders is the shop's table; the other two belong to the loyalty service (one database
	// here, to keep the example small).
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id text PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL, status text NOT NULL);
		CREATE TABLE order_timeline (n bigserial, order_id text NOT NULL, status text NOT NULL);
		CREATE TABLE loyalty_points (customer text PRIMARY KEY, points bigint NOT NULL)`); err != nil {
		return err
	}

	client := newSQSClient(cfg.SQSEndpoint)
	q, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String("orders-" + suffix + ".fifo"),
		Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		return fmt.Errorf("creating the SQS queue: %w", err)
	}
	defer client.DeleteQueue(context.WithoutCancel(ctx), &sqs.DeleteQueueInput{QueueUrl: q.QueueUrl})

	// The relay: committed events to the FIFO queue, MessageGroupId = key = order ID.
	sender, err := outboxsqs.NewSender(client, &outboxsqs.SenderConfig{QueueURL: *q.QueueUrl})
	if err != nil {
		return err
	}
	store, err := box.NewStore(db)
	if err != nil {
		return err
	}
	r, err := relay.New(store, sender, nil)
	if err != nil {
		return err
	}
	// The loyalty service: a timeline row per event, and points when an order completes, in
	// one transaction with the inbox row.
	receiver, err := outboxsqs.NewReceiver(client, &outboxsqs.ReceiverConfig{QueueURL: *q.QueueUrl, WaitTime: time.Second})
	if err != nil {
		return err
	}
	dead, err := box.NewDeadLetters(db)
	if err != nil {
		return err
	}
	loyalty, err := consumer.New(&loseOneAck{Receiver: receiver}, &consumer.Config{Name: "loyalty", DeadLetters: dead})
	if err != nil {
		return err
	}
	award := outboxsql.Idempotent(box, db, func(ctx context.Context, tx *sql.Tx, e outbox.Event[OrderStatusChanged]) error {
		o := e.Payload
		if _, err := tx.ExecContext(ctx, "INSERT INTO order_timeline (order_id, status) VALUES ($1, $2)", o.OrderID, o.Status); err != nil {
			return err
		}
		if o.Status != "completed" {
			return nil
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO loyalty_points VALUES ($1, $2)
			ON CONFLICT (customer) DO UPDATE SET points = loyalty_points.points + excluded.points`, o.Customer, o.TotalCents/100)
		return err
	}, nil)
	var o1Completed atomic.Int32 // deliveries of o-1's "completed" event the handler finished
	consumer.Handle(loyalty, func(ctx context.Context, e outbox.Event[OrderStatusChanged]) error {
		err := award(ctx, e)
		if err == nil && e.Payload.OrderID == "o-1" && e.Payload.Status == "completed" {
			o1Completed.Add(1)
		}
		return err
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- r.Run(runCtx) }()
	go func() { done <- loyalty.Run(runCtx) }()
	defer func() { stop(); <-done; <-done }()

	// The shop: three orders move through their statuses, interleaved as in real traffic.
	fmt.Fprintln(stdout, "each status change commits the order row and its event together:")
	orders := []OrderStatusChanged{{"o-1", "alice", "", 12000}, {"o-2", "bob", "", 4550}, {"o-3", "carol", "", 30000}}
	for _, status := range []string{"created", "paid", "completed"} {
		for _, o := range orders {
			if err := changeStatus(ctx, db, box, o, status); err != nil {
				return err
			}
			r.Wake() // same process: deliver now rather than at the next poll
		}
		fmt.Fprintf(stdout, "  %-9s o-1, o-2, o-3\n", status)
	}

	err = waitFor(ctx, "9 events handled and o-1's duplicate absorbed", func() (bool, error) {
		var n int
		err := db.QueryRowContext(ctx, "SELECT count(*) FROM order_timeline").Scan(&n)
		return n == 9 && o1Completed.Load() == 2, err
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "the loyalty service saw each order's events in order:")
	if err := printRows(ctx, db, stdout, "  %s: %s\n", "SELECT order_id, string_agg(status, ' → ' ORDER BY n) FROM order_timeline GROUP BY order_id ORDER BY order_id"); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "o-1's completed event reached the handler %d times (its first ack was lost); the inbox skipped the second\n", o1Completed.Load())
	fmt.Fprintln(stdout, "loyalty points, awarded once per completed order:")
	return printRows(ctx, db, stdout, "  %s: %s\n", "SELECT customer, points::text FROM loyalty_points ORDER BY customer")
}

// newSQSClient returns a client for an SQS emulator, with static test credentials rather than
// whatever AWS account the environment holds.
func newSQSClient(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
}

// changeStatus records an order's new status and publishes the change, in one transaction:
// both commit, or neither does.
func changeStatus(ctx context.Context, db *sql.DB, box *outboxsql.Outbox, o OrderStatusChanged, status string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if status == "created" {
		_, err = tx.ExecContext(ctx, "INSERT INTO orders VALUES ($1, $2, $3, 'created')", o.OrderID, o.Customer, o.TotalCents)
	} else {
		_, err = tx.ExecContext(ctx, "UPDATE orders SET status = $1 WHERE id = $2", status, o.OrderID)
	}
	if err != nil {
		return err
	}
	o.Status = status
	if err := box.Publish(ctx, tx, outbox.New(o, outbox.WithKey(o.OrderID))); err != nil {
		return err
	}
	return tx.Commit()
}

// loseOneAck drops the first acknowledgement of o-1's "completed" event, as if the
// consumer crashed after its commit and before deleting the message: SQS delivers it again.
type loseOneAck struct {
	outbox.Receiver
	lost atomic.Bool
}

func (l *loseOneAck) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	ds, err := l.Receiver.Receive(ctx, max)
	for i, d := range ds {
		m, _ := d.Message()
		e, derr := outbox.Decode[OrderStatusChanged](m)
		if derr == nil && e.Payload.OrderID == "o-1" && e.Payload.Status == "completed" && l.lost.CompareAndSwap(false, true) {
			ds[i] = lostAck{d}
		}
	}
	return ds, err
}

// lostAck makes the message visible again instead of deleting it: what the visibility
// timeout would do after a crash, without the wait.
type lostAck struct{ outbox.Delivery }

func (d lostAck) Ack(ctx context.Context) error { return d.Nack(ctx, 0) }

// printRows prints each row of a two-column query with format.
func printRows(ctx context.Context, db *sql.DB, w io.Writer, format, query string) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var a, b string
		if err := rows.Scan(&a, &b); err != nil {
			return err
		}
		fmt.Fprintf(w, format, a, b)
	}
	return rows.Err()
}

// waitFor polls cond until it holds, failing at ctx's end or after 20s.
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := cond()
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(fmt.Errorf("timed out waiting for %s", what), ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
