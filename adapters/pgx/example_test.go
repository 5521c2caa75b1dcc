package outboxpgx_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// OrderPaid is an event payload.
type OrderPaid struct {
	OrderID string `json:"order_id"`
	Points  int64  `json:"points"`
}

func (OrderPaid) EventType() string { return "orders.paid" }

// An exactly-once consumer: each event's effects commit once, together with its inbox row.
// Events handled at the same time share transactions: one commit for up to 64 events instead
// of one each, with the same exactly-once effects. It needs a PostgreSQL server, so it is
// compiled but not run.
func ExampleIdempotent() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("TXOUTBOX_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := outboxpgx.Default.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	dead, err := outboxpgx.Default.NewDeadLetters(pool)
	if err != nil {
		log.Fatal(err)
	}
	queue := outboxmemory.New(nil) // in production: outboxsqs, outboxnats or outboxazqueue's receiver
	c, err := consumer.New(queue, &consumer.Config{
		Name:        "loyalty",
		DeadLetters: dead,
		Concurrency: 32, // batches form from the events in flight: the more, the fuller
		BatchSize:   32,
	})
	if err != nil {
		log.Fatal(err)
	}
	// Write only through tx. In a batch, h may run again for an event after a rollback
	// caused by another event; its rolled-back writes never count, so effects happen once.
	consumer.Handle(c, outboxpgx.Idempotent(outboxpgx.Default, pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[OrderPaid]) error {
		_, err := tx.Exec(ctx, `UPDATE customers SET points = points + $1 WHERE order_id = $2`, e.Payload.Points, e.Payload.OrderID)
		return err
	}, nil)) // nil: batches of up to 64 events, at most 2 transactions at once;
	// &idempotency.GroupConfig{MaxEvents: 1}: a transaction per event, for a slow handler
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
