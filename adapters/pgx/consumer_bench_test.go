package outboxpgx_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/internal/benchtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// BenchmarkConsumer: events/s through the consumer runtime from the in-memory transport,
// with a handler that writes one effect row in its own transaction ("plain"), and with the
// same handler wrapped in outboxpgx.Idempotent (inbox row in the same transaction): with its
// defaults (group commit), with one transaction at a time, with 64 events in flight instead
// of 32, and with one event per transaction ("once", MaxEvents 1). The variants take turns
// for three rounds of 10,000 events, and each one's median rate is reported;
// idempotent/plain is the cost of exactly-once effects as users get them by default (target
// ≥ 1.0), once/plain its cost without group commit.
//
//	go test -run '^$' -bench BenchmarkConsumer -benchtime 1x ./adapters/pgx
func BenchmarkConsumer(b *testing.B) {
	const n, rounds = 10000, 3
	o := benchOutbox(b)
	ctx := context.Background()
	effects := o.schema + ".effects"
	// Enough connections for the handlers in flight (pgxpool's default is 4 on 2 cores),
	// their sessions told apart so that their backends' CPU time can be measured.
	pool, backends := pgxtest.TaggedPool(b, 32)
	meters := []benchtest.Meter{{Name: "cpu", Read: benchtest.BusyJiffies}, benchtest.Processes("self"), benchtest.PIDs("postgres", backends)}
	read := func() []int64 {
		v := make([]int64, len(meters))
		for i, m := range meters {
			v[i] = m.Read()
		}
		return v
	}
	if _, err := o.pool.Exec(ctx, "CREATE TABLE "+effects+" (event_id uuid PRIMARY KEY, total bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx, e outbox.Event[order]) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1, $2)", e.ID, e.Payload.Total)
		return err
	}
	// measure returns the events/s of one round and the CPU time each meter read meanwhile.
	measure := func(name string, concurrency int, h consumer.Handler[order]) (float64, []int64) {
		c, q := queuedConsumer(b, o, name, n, concurrency, h)
		cpu := read()
		elapsed := runUntilDrained(b, c, q)
		for i, c1 := range read() {
			if cpu[i] >= 0 && c1 >= 0 {
				cpu[i] = c1 - cpu[i]
			} else {
				cpu[i] = -1
			}
		}
		if _, err := o.pool.Exec(ctx, "TRUNCATE "+effects); err != nil {
			b.Fatal(err)
		}
		return n / elapsed.Seconds(), cpu
	}
	variants := []struct {
		name        string
		concurrency int
		h           consumer.Handler[order]
	}{
		{"plain", 32, func(ctx context.Context, e outbox.Event[order]) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return effect(ctx, tx, e) })
		}},
		{"idempotent", 32, outboxpgx.Idempotent(o.Outbox, pool, effect, nil)},
		{"once", 32, outboxpgx.Idempotent(o.Outbox, pool, effect, &idempotency.GroupConfig{MaxEvents: 1})},
		{"idempotent_1tx", 32, outboxpgx.Idempotent(o.Outbox, pool, effect, &idempotency.GroupConfig{MaxTransactions: 1})},
		{"idempotent_c64", 64, outboxpgx.Idempotent(o.Outbox, pool, effect, nil)},
	}
	rates, cpu := map[string][]float64{}, map[string][]int64{}
	for round := range rounds {
		for _, v := range variants {
			// Each round's consumer has a name of its own: a fresh inbox.
			r, c := measure(fmt.Sprintf("%s_%d", v.name, round), v.concurrency, v.h)
			rates[v.name] = append(rates[v.name], r)
			if cpu[v.name] == nil {
				cpu[v.name] = make([]int64, len(meters))
			}
			for i := range c {
				if c[i] < 0 || cpu[v.name][i] < 0 {
					cpu[v.name][i] = -1
				} else {
					cpu[v.name][i] += c[i]
				}
			}
		}
	}
	plain, idem, once := median(rates["plain"]), median(rates["idempotent"]), median(rates["once"])
	// The database's own ceiling: the same transaction from 32 goroutines, no consumer.
	var next atomic.Int64
	ceiling := rate(b, 32, func(ctx context.Context) error {
		e := outbox.New(order{next.Add(1), 42})
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return effect(ctx, tx, e) })
	})
	b.ReportMetric(ceiling, "raw_tx/s")
	b.ReportMetric(plain, "plain_events/s")
	b.ReportMetric(idem, "idempotent_events/s")
	b.ReportMetric(idem/plain, "idempotent/plain")
	b.ReportMetric(idem/ceiling, "idempotent/raw_tx")
	b.ReportMetric(once, "once_events/s")
	b.ReportMetric(once/plain, "once/plain")
	b.ReportMetric(idem/once, "idempotent/once")
	b.ReportMetric(median(rates["idempotent_1tx"]), "idempotent_1tx_events/s")
	b.ReportMetric(median(rates["idempotent_c64"]), "idempotent_c64_events/s")
	// On Linux, CPU time per event: the machine's (client, database and whatever else
	// runs), this process's, and the handlers' database backends'.
	for _, name := range []string{"plain", "idempotent", "once"} {
		for i, c := range cpu[name] {
			if c >= 0 {
				b.ReportMetric(float64(c)*1e6/benchtest.ClockTicks/(n*rounds), name+"_"+meters[i].Name+"_µs/event")
			}
		}
	}
}

// queuedConsumer returns an in-memory queue holding n order events and a consumer named name
// (a fresh inbox) that runs h on them, concurrency at a time.
func queuedConsumer(b *testing.B, o *testOutbox, name string, n, concurrency int, h consumer.Handler[order]) (*consumer.Consumer, *outboxmemory.Queue) {
	q := outboxmemory.New(nil)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i], _ = outbox.New(order{int64(i), 42}).Encode()
	}
	if err := q.Send(context.Background(), msgs); err != nil {
		b.Fatal(err)
	}
	c, err := consumer.New(q, &consumer.Config{Name: name, DeadLetters: o.deadLetters(b), Concurrency: concurrency, BatchSize: concurrency})
	if err != nil {
		b.Fatal(err)
	}
	consumer.Handle(c, h)
	return c, q
}

// runUntilDrained runs c until q is empty and returns how long it took.
func runUntilDrained(b *testing.B, c *consumer.Consumer, q *outboxmemory.Queue) time.Duration {
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

// BenchmarkConsumerHandlerCost: what grouping by default costs a handler heavier than one
// INSERT. For handlers of 1, 4 and 8 INSERTs and one of an INSERT that waits 2 ms in the
// database (a lock wait, a slow query: time, not work), events/s of the handler in a
// transaction of its own without the inbox ("plain"), in outboxpgx.Idempotent with its
// defaults, with one event per transaction (MaxEvents 1: "once") and with a fixed
// MaxTransactions 2 ("fixed2", batches sized by count alone); 32 events in flight, three
// rounds of 4,000 events, medians reported as ratios to plain in the same run.
//
//	go test -run '^$' -bench BenchmarkConsumerHandlerCost -benchtime 1x ./adapters/pgx
func BenchmarkConsumerHandlerCost(b *testing.B) {
	const n, rounds = 4000, 3
	o := benchOutbox(b)
	ctx := context.Background()
	effects := o.schema + ".cost_effects"
	pool, _ := pgxtest.TaggedPool(b, 32)
	if _, err := o.pool.Exec(ctx, "CREATE TABLE "+effects+" (event_id uuid NOT NULL, k int NOT NULL, total bigint NOT NULL, PRIMARY KEY (event_id, k))"); err != nil {
		b.Fatal(err)
	}
	measure := func(name string, h consumer.Handler[order]) float64 {
		c, q := queuedConsumer(b, o, name, n, 32, h)
		elapsed := runUntilDrained(b, c, q)
		if _, err := o.pool.Exec(ctx, "TRUNCATE "+effects); err != nil {
			b.Fatal(err)
		}
		return n / elapsed.Seconds()
	}
	for _, handler := range []struct {
		name    string
		inserts int // 0: one INSERT after a 2 ms wait
	}{{"1insert", 1}, {"4inserts", 4}, {"8inserts", 8}, {"wait2ms", 0}} {
		effect := func(ctx context.Context, tx pgx.Tx, e outbox.Event[order]) error {
			if handler.inserts == 0 {
				_, err := tx.Exec(ctx, "INSERT INTO "+effects+" SELECT $1, 0, $2 FROM pg_sleep(0.002)", e.ID, e.Payload.Total)
				return err
			}
			for i := range handler.inserts {
				if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1, $2, $3)", e.ID, i, e.Payload.Total); err != nil {
					return err
				}
			}
			return nil
		}
		variants := []struct {
			name string
			h    consumer.Handler[order]
		}{
			{"plain", func(ctx context.Context, e outbox.Event[order]) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return effect(ctx, tx, e) })
			}},
			{"idempotent", outboxpgx.Idempotent(o.Outbox, pool, effect, nil)},
			{"once", outboxpgx.Idempotent(o.Outbox, pool, effect, &idempotency.GroupConfig{MaxEvents: 1})},
			{"fixed2", outboxpgx.Idempotent(o.Outbox, pool, effect, &idempotency.GroupConfig{MaxTransactions: 2})},
		}
		rates := map[string][]float64{}
		for round := range rounds {
			for _, v := range variants {
				rates[v.name] = append(rates[v.name], measure(fmt.Sprintf("%s_%s_%d", handler.name, v.name, round), v.h))
			}
		}
		plain := median(rates["plain"])
		b.ReportMetric(plain, handler.name+"_plain_events/s")
		for _, v := range variants[1:] {
			b.ReportMetric(median(rates[v.name])/plain, handler.name+"_"+v.name+"/plain")
		}
	}
}
