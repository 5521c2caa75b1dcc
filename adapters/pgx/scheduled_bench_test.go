package outboxpgx_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/relay"
)

// BenchmarkScheduled measures scheduled events (docs/scheduled.md).
//
// "lateness": 100,000 events due evenly over 60 s, published before the first falls due,
// delivered by a relay with the default config: how late each was sent after its time
// (p50/p99/max), and how many were early (must be 0). TXOUTBOX_BENCH_SCHEDULED_WINDOW
// shortens the window (a Go duration) for a quick look.
//
// "future": commit → transport latency of immediate events at 1,000/s (as BenchmarkLatency)
// into an outbox with 1,000,000 events scheduled for tomorrow and into one with none, in the
// same run, alternating (and which goes first), four times each: ratio = none's p50 (p99) / the million's, so ≥ 1 means
// the waiting events cost nothing.
func BenchmarkScheduled(b *testing.B) {
	b.Run("lateness", func(b *testing.B) {
		window := 60 * time.Second
		if w, err := time.ParseDuration(os.Getenv("TXOUTBOX_BENCH_SCHEDULED_WINDOW")); err == nil && w > 0 {
			window = w
		}
		benchLateness(b, 100_000, window)
	})
	b.Run("future", func(b *testing.B) { benchFuture(b, 1_000_000) })
}

func benchLateness(b *testing.B, events int, window time.Duration) {
	ctx := context.Background()
	o := benchOutbox(b)
	first := time.Now().Add(10 * time.Second) // publishing 100k takes a few seconds
	due := make(map[uuid.UUID]time.Time, events)
	const perTx = 1000
	for i := 0; i < events; i += perTx {
		batch := make([]outbox.Encodable, 0, perTx)
		for j := i; j < min(i+perTx, events); j++ {
			at := first.Add(window * time.Duration(j) / time.Duration(events))
			e := outbox.New(order{int64(j), 42}, outbox.WithDeliverAt(at))
			due[e.ID] = e.DeliverAt
			batch = append(batch, e)
		}
		if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, batch...) }); err != nil {
			b.Fatal(err)
		}
	}
	if time.Now().After(first) {
		b.Fatalf("publishing %d scheduled events took past the first one's time", events)
	}
	sink := &latencySink{at: map[uuid.UUID]time.Time{}}
	r, err := relay.New(o.store(b), sink, nil)
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(runCtx); close(done) }()
	deadline := first.Add(window + time.Minute)
	for {
		sink.mu.Lock()
		got := len(sink.at)
		sink.mu.Unlock()
		if got >= events || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if len(sink.at) != events {
		b.Fatalf("%d of %d scheduled events were delivered by %v", len(sink.at), events, deadline)
	}
	var late []time.Duration
	early := 0
	for id, at := range sink.at {
		d := at.Sub(due[id])
		if d < 0 {
			early++
		}
		late = append(late, d)
	}
	slices.Sort(late)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(late[len(late)/2]), "late_p50_ms")
	b.ReportMetric(ms(late[len(late)*99/100]), "late_p99_ms")
	b.ReportMetric(ms(late[len(late)-1]), "late_max_ms")
	b.ReportMetric(float64(early), "early")
	b.ReportMetric(window.Seconds(), "window_s")
}

func benchFuture(b *testing.B, future int) {
	ctx := context.Background()
	none, million := benchOutbox(b), benchOutbox(b)
	// The million rows as Publish writes them, made by the server (Publish would take
	// minutes): due tomorrow, spread over an hour.
	if _, err := million.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.outbox_scheduled (id, type, key, headers, content_type, body, created_at, deliver_at)
SELECT gen_random_uuid(), 'bench.order_placed', '', NULL, 'application/json', '{"id":1,"total":42}'::bytea, now(),
       now() + interval '1 day' + i * interval '3.6 milliseconds'
  FROM generate_series(1, %d) AS i`, million.schema, future)); err != nil {
		b.Fatal(err)
	}
	// Settled as a day-old backlog would be: vacuumed, and its pages written out, so that the
	// checkpoint after the fill does not land in the measurement.
	for _, stmt := range []string{"VACUUM ANALYZE " + million.schema + ".outbox_scheduled", "CHECKPOINT"} {
		if _, err := million.pool.Exec(ctx, stmt); err != nil {
			b.Fatal(err)
		}
	}
	var p50, p99 [2][]float64
	for round := range 4 {
		order := []int{0, 1}
		if round%2 == 1 { // alternate which goes first
			order = []int{1, 0}
		}
		for _, i := range order {
			o := []*testOutbox{none, million}[i]
			r := runLatency(b, o, nil, 0, 2000)
			p50[i], p99[i] = append(p50[i], r.ms(0.5)), append(p99[i], r.ms(0.99))
			b.Logf("round %d, %s: p50 %.2f ms, p99 %.2f ms", round+1, []string{"none waiting", "1M waiting"}[i], r.ms(0.5), r.ms(0.99))
		}
	}
	b.ReportMetric(median(p50[0]), "none_p50_ms")
	b.ReportMetric(median(p99[0]), "none_p99_ms")
	b.ReportMetric(median(p50[1]), "1M_p50_ms")
	b.ReportMetric(median(p99[1]), "1M_p99_ms")
	b.ReportMetric(median(p50[0])/median(p50[1]), "p50_none/1M")
	b.ReportMetric(median(p99[0])/median(p99[1]), "p99_none/1M")
}
