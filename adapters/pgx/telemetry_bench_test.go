package outboxpgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/internal/benchtest"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// sdkProviders are what an application installs: every span sampled and batched to an
// exporter (one that discards: the export's cost is the collector's), metrics aggregated
// for a reader.
func sdkProviders(b *testing.B) (trace.TracerProvider, metric.MeterProvider) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return tp, mp
}

// tracedEvents returns n events each published by a request of its own: a distinct
// traceparent per event, the worst case for the relay's links.
func tracedEvents(n int) []outbox.Encodable {
	evs := make([]outbox.Encodable, n)
	id := make([]byte, 24)
	for i := range evs {
		_, _ = rand.Read(id)
		tp := "00-" + hex.EncodeToString(id[:16]) + "-" + hex.EncodeToString(id[16:]) + "-01"
		evs[i] = outbox.New(order{int64(i), 42}, outbox.WithHeader("traceparent", tp))
	}
	return evs
}

func fillTraced(b *testing.B, o *testOutbox, n int) {
	b.Helper()
	ctx := context.Background()
	evs := tracedEvents(n)
	for start := 0; start < n; start += 10000 {
		chunk := evs[start:min(n, start+10000)]
		if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, chunk...) }); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := o.pool.Exec(ctx, "VACUUM ANALYZE "+o.schema+".outbox"); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTelemetryOverhead: the relay draining to a transport that accepts everything
// (default batch of 500, every event from a request of its own) and the consumer running an
// idempotent handler (concurrency 32), each with telemetry off (no SDK installed: the
// global no-op providers) and on (an SDK tracing every span and aggregating every metric),
// for six rounds in the same run, alternating which goes first; medians are reported, and
// on/off (the median of each round's ratio) is the overhead (target ≥ 0.95); the CPU this
// process spent per event is reported beside it. Each round's numbers are logged.
func BenchmarkTelemetryOverhead(b *testing.B) {
	const rounds = 6
	o := benchOutbox(b)
	tp, mp := sdkProviders(b)
	b.Run("relay", func(b *testing.B) {
		const n = 30000
		drain := func(cfg *relay.Config) (float64, float64) {
			fillTraced(b, o, n)
			cpu := cpuTime()
			rate := drainWith(b, o, n, cfg)
			return rate, (cpuTime() - cpu).Seconds() * 1e6 / n
		}
		var off, on, offCPU, onCPU []float64
		for i := range rounds {
			for _, telemetry := range turns(i) {
				if telemetry {
					r, c := drain(&relay.Config{TracerProvider: tp, MeterProvider: mp})
					on, onCPU = append(on, r), append(onCPU, c)
				} else {
					r, c := drain(&relay.Config{})
					off, offCPU = append(off, r), append(offCPU, c)
				}
			}
		}
		report(b, off, on, offCPU, onCPU)
	})
	b.Run("consumer", func(b *testing.B) {
		const n = 10000
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, pgxtest.URL()+"&pool_max_conns=32")
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		effects := o.schema + ".telemetry_effects"
		if _, err := o.pool.Exec(ctx, "CREATE TABLE "+effects+" (event_id uuid PRIMARY KEY, total bigint NOT NULL)"); err != nil {
			b.Fatal(err)
		}
		consume := func(cfg consumer.Config) (float64, float64) {
			q := outboxmemory.New(nil)
			msgs := make([]outbox.Message, n)
			for i, e := range tracedEvents(n) {
				msgs[i], _ = e.Encode()
			}
			if err := q.Send(ctx, msgs); err != nil {
				b.Fatal(err)
			}
			cfg.Name = "telemetry" // fresh events each run: new inbox keys
			cfg.DeadLetters, cfg.Concurrency, cfg.BatchSize = o.deadLetters(b), 32, 32
			c, err := consumer.New(q, &cfg)
			if err != nil {
				b.Fatal(err)
			}
			consumer.Handle(c, outboxpgx.Idempotent(o.Outbox, pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[order]) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1, $2)", e.ID, e.Payload.Total)
				return err
			}, nil))
			cpu := cpuTime()
			elapsed := runUntilDrained(b, c, q)
			perEvent := (cpuTime() - cpu).Seconds() * 1e6 / n
			if _, err := o.pool.Exec(ctx, "TRUNCATE "+effects); err != nil {
				b.Fatal(err)
			}
			return n / elapsed.Seconds(), perEvent
		}
		var off, on, offCPU, onCPU []float64
		for i := range rounds {
			for _, telemetry := range turns(i) {
				if telemetry {
					r, c := consume(consumer.Config{TracerProvider: tp, MeterProvider: mp})
					on, onCPU = append(on, r), append(onCPU, c)
				} else {
					r, c := consume(consumer.Config{})
					off, offCPU = append(off, r), append(offCPU, c)
				}
			}
		}
		report(b, off, on, offCPU, onCPU)
	})
}

// turns alternates which run goes first in round i, so neither profits from running second
// (a warmer cache, a table or an inbox that grew in between).
func turns(i int) []bool {
	if i%2 == 0 {
		return []bool{false, true}
	}
	return []bool{true, false}
}

// report reports the medians of both runs: throughput, and this process's CPU time per
// event (user + system: the library's own cost, which the shared machine's load blurs less).
// on/off is the median of the rounds' own ratios: the two runs of a round are back to back,
// so a change of the machine's load between rounds (another process starting, a table that
// grew) cancels out of it instead of landing on one side.
func report(b *testing.B, off, on, offCPU, onCPU []float64) {
	ratios := make([]float64, len(off))
	for i := range off {
		ratios[i] = on[i] / off[i]
	}
	b.Logf("per round: off %.0f events/s, on %.0f, on/off %.3f; CPU µs/event off %.2f, on %.2f", off, on, ratios, offCPU, onCPU)
	b.ReportMetric(median(off), "off_events/s")
	b.ReportMetric(median(on), "on_events/s")
	b.ReportMetric(median(ratios), "on/off")
	b.ReportMetric(median(offCPU), "off_cpu_µs/event")
	b.ReportMetric(median(onCPU), "on_cpu_µs/event")
}

// cpuTime is the CPU time this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkConsumerTelemetry is the consumer's telemetry alone, per event: deliveries ready
// in memory (each from a request of its own, to a named destination), a handler that does
// nothing, Concurrency 32 and batches of 32, telemetry off and on as in
// BenchmarkTelemetryOverhead. on minus off is what telemetry adds; its B/op and allocs/op
// do not depend on the machine's load, unlike the overhead's ratio; cpu_ns/op (this
// process's CPU time, the garbage collector's included) depends on it less than ns/op. No
// database.
//
//	go test -run '^$' -bench ConsumerTelemetry -benchmem ./adapters/pgx
func BenchmarkConsumerTelemetry(b *testing.B) {
	tp, mp := sdkProviders(b)
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			msgs := make([]outbox.Message, b.N)
			for i, e := range tracedEvents(b.N) {
				msgs[i], _ = e.Encode()
			}
			r := namedReceiver{benchtest.NewReadyReceiver(msgs)}
			cfg := consumer.Config{Name: "bench", DeadLetters: &outboxtest.DeadLetters{}, Concurrency: 32, BatchSize: 32}
			if on {
				cfg.TracerProvider, cfg.MeterProvider = tp, mp
			}
			c, err := consumer.New(r, &cfg)
			if err != nil {
				b.Fatal(err)
			}
			consumer.Handle(c, func(context.Context, outbox.Event[order]) error { return nil })
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime()
			go func() { ran <- c.Run(ctx) }()
			r.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N), "cpu_ns/op")
			cancel()
			if err := <-ran; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// namedReceiver is a benchtest.ReadyReceiver whose messages come from the destination
// "orders": the process spans are named after it, as a real broker's are.
type namedReceiver struct{ *benchtest.ReadyReceiver }

func (namedReceiver) MessagingSystem() string               { return "memory" }
func (namedReceiver) DestinationName(outbox.Message) string { return "orders" }
