package outboxpgx_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
	outboxmem "github.com/txoutbox/outbox/transports/memory"
)

// BenchmarkConsumer: events/s through the consumer runtime from the in-memory transport,
// with a handler that writes one effect row in its own transaction, with the same handler
// wrapped in outboxpgx.Idempotent (inbox row in the same transaction), and wrapped in
// outboxpgx.IdempotentGrouped (group commit: defaults, one transaction at a time, and 64
// events in flight instead of 32). Measured in the same run; idempotent/plain is the cost
// of exactly-once effects, grouped/idempotent what group commit gains back.
func BenchmarkConsumer(b *testing.B) {
	const n = 20000
	o := benchOutbox(b)
	ctx := context.Background()
	effects := o.schema + ".effects"
	// Enough connections for the handlers in flight (pgxpool's default is 4 on 2 cores).
	pool, err := pgxpool.New(ctx, pgxtest.URL()+"&pool_max_conns=32")
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := o.pool.Exec(ctx, "CREATE TABLE "+effects+" (event_id uuid PRIMARY KEY, total bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx, e outbox.Event[order]) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1, $2)", e.ID, e.Payload.Total)
		return err
	}
	measure := func(name string, concurrency int, h consumer.Handler[order]) float64 {
		q := outboxmem.New(nil)
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i], _ = outbox.New(order{int64(i), 42}).Encode()
		}
		if err := q.Send(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		c, err := consumer.New(q, &consumer.Config{Name: name, DeadLetters: o.deadLetters(b), Concurrency: concurrency, BatchSize: concurrency})
		if err != nil {
			b.Fatal(err)
		}
		consumer.Handle(c, h)
		elapsed := runUntilDrained(b, c, q)
		if _, err := o.pool.Exec(ctx, "TRUNCATE "+effects); err != nil {
			b.Fatal(err)
		}
		return n / elapsed.Seconds()
	}
	plain := measure("plain", 32, func(ctx context.Context, e outbox.Event[order]) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return effect(ctx, tx, e) })
	})
	idem := measure("idempotent", 32, outboxpgx.IdempotentAt(o.Outbox, pool, effect))
	grouped := measure("grouped", 32, outboxpgx.IdempotentGroupedAt(o.Outbox, pool, effect, nil))
	grouped1 := measure("grouped_1tx", 32, outboxpgx.IdempotentGroupedAt(o.Outbox, pool, effect, &idempotency.GroupConfig{MaxTransactions: 1}))
	grouped64 := measure("grouped_c64", 64, outboxpgx.IdempotentGroupedAt(o.Outbox, pool, effect, nil))
	// The database's own ceiling: the same transaction from 32 goroutines, no consumer.
	var next atomic.Int64
	ceiling := rate(b, 32, func(ctx context.Context) error {
		e := outbox.New(order{next.Add(1), 42})
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return effect(ctx, tx, e) })
	})
	b.ReportMetric(ceiling, "raw_tx/s")
	b.ReportMetric(idem/ceiling, "idempotent/raw_tx")
	b.ReportMetric(plain, "plain_events/s")
	b.ReportMetric(idem, "idempotent_events/s")
	b.ReportMetric(idem/plain, "idempotent/plain")
	b.ReportMetric(grouped, "grouped_events/s")
	b.ReportMetric(grouped/idem, "grouped/idempotent")
	b.ReportMetric(grouped/ceiling, "grouped/raw_tx")
	b.ReportMetric(grouped1, "grouped_1tx_events/s")
	b.ReportMetric(grouped64, "grouped_c64_events/s")
}

// runUntilDrained runs c until q is empty and returns how long it took.
func runUntilDrained(b *testing.B, c *consumer.Consumer, q *outboxmem.Queue) time.Duration {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	for q.Len() > 0 {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return elapsed
}
