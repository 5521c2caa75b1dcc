package outboxpgx_test

// Benchmarks against the raw SQL loops of DESIGN §11, measured side by side in one run.
// Each benchmark ignores b.N and measures its variants for a fixed time, reporting rates
// and ratios as metrics; run them with
//
//	go test -run '^$' -bench . -benchtime 1x ./adapters/pgx

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
)

const measureFor = 3 * time.Second

// interleave measures each variant for 1s per round, rounds times in turn, and returns each
// one's median rate.
func interleave(b *testing.B, rounds, clients int, variants []func(ctx context.Context) error) []float64 {
	b.Helper()
	all := make([][]float64, len(variants))
	for range rounds {
		for i, v := range variants {
			all[i] = append(all[i], rateFor(b, time.Second, clients, v))
		}
	}
	out := make([]float64, len(variants))
	for i, rs := range all {
		out[i] = median(rs)
	}
	return out
}

// rate runs op from clients goroutines for measureFor and returns operations per second.
func rate(b *testing.B, clients int, op func(ctx context.Context) error) float64 {
	b.Helper()
	return rateFor(b, measureFor, clients, op)
}

// rateFor runs op from clients goroutines for d and returns operations per second.
func rateFor(b *testing.B, d time.Duration, clients int, op func(ctx context.Context) error) float64 {
	b.Helper()
	ctx := context.Background()
	var n atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := op(ctx); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

type order struct {
	ID    int64
	Total int64
}

func (order) EventType() string { return "bench.order_placed" }

func benchOutbox(b *testing.B) *testOutbox {
	o := newTestOutbox(b)
	if _, err := o.pool.Exec(context.Background(), "CREATE TABLE "+o.schema+".orders (id bigserial PRIMARY KEY, total bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	return o
}

// BenchmarkProducer: one business INSERT per transaction, alone, with a hand-written outbox
// INSERT, and with outboxpgx.Publish; 8 clients.
func BenchmarkProducer(b *testing.B) {
	o := benchOutbox(b)
	const clients = 8
	business := "INSERT INTO " + o.schema + ".orders (total) VALUES ($1)"
	rawOutbox := "INSERT INTO " + o.schema + ".outbox (id, type, key, headers, content_type, body, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)"
	tx := func(body func(ctx context.Context, tx pgx.Tx) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, o.pool, func(t pgx.Tx) error { return body(ctx, t) })
		}
	}
	variants := []func(ctx context.Context) error{
		tx(func(ctx context.Context, t pgx.Tx) error { // the business transaction alone
			_, err := t.Exec(ctx, business, 42)
			return err
		}),
		tx(func(ctx context.Context, t pgx.Tx) error { // + a hand-written outbox INSERT
			if _, err := t.Exec(ctx, business, 42); err != nil {
				return err
			}
			id, _ := uuid.NewV7()
			_, err := t.Exec(ctx, rawOutbox, id, "bench.order_placed", "", nil, "application/json", []byte(`{"ID":1,"Total":42}`), time.Now())
			return err
		}),
		// What txoutbox does not do: NOTIFY inside the producer's transaction, which takes
		// a global lock at commit and serialises producers.
		tx(func(ctx context.Context, t pgx.Tx) error {
			if _, err := t.Exec(ctx, business, 42); err != nil {
				return err
			}
			id, _ := uuid.NewV7()
			if _, err := t.Exec(ctx, rawOutbox, id, "bench.order_placed", "", nil, "application/json", []byte(`{"ID":1,"Total":42}`), time.Now()); err != nil {
				return err
			}
			_, err := t.Exec(ctx, "SELECT pg_notify('outbox', '')")
			return err
		}),
		tx(func(ctx context.Context, t pgx.Tx) error { // + outboxpgx.Publish
			if _, err := t.Exec(ctx, business, 42); err != nil {
				return err
			}
			return o.Publish(ctx, t, outbox.New(order{1, 42}))
		}),
	}
	// Interleaved rounds, medians: the disk's commit rate drifts over a run, and measuring
	// each variant in one block would turn that drift into a ratio.
	rates := interleave(b, 5, clients, variants)
	alone, raw, notify, lib := rates[0], rates[1], rates[2], rates[3]
	b.ReportMetric(alone, "business_tx/s")
	b.ReportMetric(raw, "raw_outbox_tx/s")
	b.ReportMetric(lib, "publish_tx/s")
	b.ReportMetric(lib/raw, "publish/raw")
	b.ReportMetric(lib/alone, "publish/business")
	b.ReportMetric(notify/raw, "raw+notify/raw")
}

// BenchmarkProducerBatch: 100 events in one transaction, through Publish (COPY) and through
// pgx CopyFrom by hand; one client.
func BenchmarkProducerBatch(b *testing.B) {
	o := benchOutbox(b)
	const batch = 100
	events := make([]outbox.Encodable, batch)
	lib := rate(b, 1, func(ctx context.Context) error {
		for i := range events {
			events[i] = outbox.New(order{int64(i), 42})
		}
		return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, events...) })
	}) * batch
	raw := rate(b, 1, func(ctx context.Context) error {
		rows := make([][]any, batch)
		for i := range rows {
			id, _ := uuid.NewV7()
			rows[i] = []any{id, "bench.order_placed", "", nil, "application/json", []byte(`{"ID":1,"Total":42}`), time.Now()}
		}
		return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{o.schema, "outbox"},
				[]string{"id", "type", "key", "headers", "content_type", "body", "created_at"}, pgx.CopyFromRows(rows))
			return err
		})
	}) * batch
	b.ReportMetric(1e6/lib, "publish_µs/event")
	b.ReportMetric(1e6/raw, "raw_copy_µs/event")
	b.ReportMetric(lib/raw, "publish/raw")
}

// fill loads n keyless events with COPY.
func fill(b *testing.B, o *testOutbox, n int) {
	b.Helper()
	ctx := context.Background()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i], _ = outbox.New(order{int64(i), 42}).Encode()
	}
	for start := 0; start < n; start += 10000 {
		chunk := make([]outbox.Encodable, 0, 10000)
		for _, m := range msgs[start:min(n, start+10000)] {
			chunk = append(chunk, m)
		}
		if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, chunk...) }); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := o.pool.Exec(ctx, "VACUUM ANALYZE "+o.schema+".outbox"); err != nil {
		b.Fatal(err)
	}
}

type discard struct{ n atomic.Int64 }

func (d *discard) Send(_ context.Context, msgs []outbox.Message) error {
	d.n.Add(int64(len(msgs)))
	return nil
}

// BenchmarkRelayDrain: drain N events to a transport that accepts everything, with the relay
// (default config but for the batch size) and with the raw claim+DELETE…RETURNING loop, at
// batch 100 and 1000. Raw and relay alternate for five rounds; medians are reported.
func BenchmarkRelayDrain(b *testing.B) {
	const n, rounds = 30000, 5
	for _, batch := range []int{100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			o := benchOutbox(b)
			var raw, lib []float64
			for range rounds {
				fill(b, o, n)
				raw = append(raw, drainRaw(b, o, n, batch))
				fill(b, o, n)
				lib = append(lib, drainRelay(b, o, n, batch))
			}
			rawRate, libRate := median(raw), median(lib)
			b.ReportMetric(rawRate, "raw_events/s")
			b.ReportMetric(libRate, "relay_events/s")
			b.ReportMetric(libRate/rawRate, "relay/raw")
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// drainRaw empties the outbox with the hand-written loop and returns events/s.
func drainRaw(b *testing.B, o *testOutbox, n, batch int) float64 {
	ctx := context.Background()
	raw := "DELETE FROM " + o.schema + ".outbox WHERE seq IN (SELECT seq FROM " + o.schema +
		".outbox ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING seq, id, type, key, headers, content_type, body, created_at"
	// The baseline runs without JIT, as the relay's functions do: a fair, fast loop.
	conn, err := o.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET jit = off"); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for done := 0; done < n; {
		rows, _ := conn.Query(ctx, raw, batch)
		for rows.Next() {
			var (
				seq     int64
				id      uuid.UUID
				typ, ky string
				hdr     []byte
				ct      string
				body    []byte
				at      time.Time
			)
			if err := rows.Scan(&seq, &id, &typ, &ky, &hdr, &ct, &body, &at); err != nil {
				b.Fatal(err)
			}
			done++
		}
		if rows.Err() != nil {
			b.Fatal(rows.Err())
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// drainRelay empties the outbox with a relay and returns events/s.
func drainRelay(b *testing.B, o *testOutbox, n, batch int) float64 {
	return drainWith(b, o, n, &outbox.RelayConfig{BatchSize: batch})
}

// drainWith empties the outbox of its n events with a relay configured by cfg and returns
// events/s.
func drainWith(b *testing.B, o *testOutbox, n int, cfg *outbox.RelayConfig) float64 {
	sink := &discard{}
	relay, err := outbox.NewRelay(o.store(b), sink, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() { _ = relay.Run(ctx); close(done) }()
	for sink.n.Load() < int64(n) {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	<-done
	return float64(n) / elapsed.Seconds()
}

// latencySink records when each message reached the transport.
type latencySink struct {
	mu sync.Mutex
	at map[uuid.UUID]time.Time
}

func (s *latencySink) Send(_ context.Context, msgs []outbox.Message) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.at[m.ID] = now
	}
	return nil
}

// BenchmarkLatency: commit → transport latency at 1,000 events/s with the default relay
// config (adaptive polling, no NOTIFY).
func BenchmarkLatency(b *testing.B) {
	o := benchOutbox(b)
	ctx, cancel := context.WithCancel(context.Background())
	sink := &latencySink{at: map[uuid.UUID]time.Time{}}
	relay, err := outbox.NewRelay(o.store(b), sink, nil)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = relay.Run(ctx); close(done) }()
	committed := map[uuid.UUID]time.Time{}
	tick := time.NewTicker(time.Millisecond)
	for range 3000 {
		<-tick.C
		e := outbox.New(order{1, 42})
		if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, e) }); err != nil {
			b.Fatal(err)
		}
		committed[e.ID] = time.Now()
	}
	tick.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sink.mu.Lock()
		got := len(sink.at)
		sink.mu.Unlock()
		if got >= len(committed) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	var lat []time.Duration
	for id, c := range committed {
		if at, ok := sink.at[id]; ok {
			lat = append(lat, max(0, at.Sub(c)))
		}
	}
	if len(lat) != len(committed) {
		b.Fatalf("%d of %d events arrived", len(lat), len(committed))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}
