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
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/benchtest"
	"github.com/txoutbox/outbox/relay"
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
// INSERT, and with Outbox.Publish; 8 clients.
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
		tx(func(ctx context.Context, t pgx.Tx) error { // + Outbox.Publish
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
func fill(b *testing.B, o *testOutbox, n int) { fillKeyed(b, o, n, func(int) string { return "" }) }

// fillKeyed loads n events with COPY, event i with key(i) as its ordering key.
func fillKeyed(b *testing.B, o *testOutbox, n int, key func(i int) string) {
	b.Helper()
	ctx := context.Background()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i], _ = outbox.New(order{int64(i), 42}, outbox.WithKey(key(i))).Encode()
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
	// A checkpoint now, so that none starts during the drain: one that does makes the drain
	// write every page it touches whole to the WAL, and the drains' rates, which are
	// compared with each other, would depend on when one happened to start (±30%).
	for _, q := range []string{"VACUUM ANALYZE " + o.schema + ".outbox", "CHECKPOINT"} {
		if _, err := o.pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
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

// BenchmarkRelayDrainKeys: drain a backlog of 100k events whose ordering keys take 1, 10,
// 100, 1,000 or 100k (all distinct) values, round-robin, with the default relay config and a
// transport that accepts everything, and report each rate as a ratio to a keyless backlog
// drained just before it in the same run. A drain that has not finished after drainKeysCap is cut short and
// rated on what it delivered. $TXOUTBOX_BENCH_KEYS (e.g. "keyless,1") picks some shapes.
//
//	go test -run '^$' -bench RelayDrainKeys -benchtime 1x ./adapters/pgx
func BenchmarkRelayDrainKeys(b *testing.B) {
	const n = 100000
	benchtest.DrainKeys(b, n, func(b *testing.B, key func(int) string) float64 {
		o := benchOutbox(b)
		fillKeyed(b, o, n, key)
		rate := benchtest.DrainRelay(b, o.store(b), n, nil, drainKeysCap)
		// Dropped now, not when the benchmark ends: eleven drained outboxes of ~40 MB each
		// would crowd PostgreSQL's buffers (128 MB by default) and slow the later drains.
		if _, err := o.pool.Exec(context.Background(), "DROP SCHEMA "+o.schema+" CASCADE"); err != nil {
			b.Fatal(err)
		}
		return rate
	})
}

// drainKeysCap bounds each drain of BenchmarkRelayDrainKeys.
const drainKeysCap = 60 * time.Second

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
	return drainWith(b, o, n, &relay.Config{BatchSize: batch})
}

// drainWith empties the outbox of its n events with a relay configured by cfg and returns
// events/s.
func drainWith(b *testing.B, o *testOutbox, n int, cfg *relay.Config) float64 {
	return benchtest.DrainRelay(b, o.store(b), n, cfg, time.Hour)
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
// config (adaptive polling, no NOTIFY), and with a fixed 10 ms poll for comparison (the
// usual setting of polling forwarders such as Watermill's). Beside p50/p99/max it reports
// the claims the relay made and the CPU the PostgreSQL server spent per event: in the
// relay's own backends, in the producer's, and in every server process (the last includes
// whatever else the server is doing; all read from /proc, so only for a local server).
// "keys=100" is the default config with events keyed by 100 keys (the claims of keyed
// events take their partitions' locks).
func BenchmarkLatency(b *testing.B) {
	b.Run("defaults", func(b *testing.B) { benchLatency(b, nil, 0) })
	b.Run("poll=10ms", func(b *testing.B) {
		benchLatency(b, &relay.Config{MinPollInterval: 10 * time.Millisecond, MaxPollInterval: 10 * time.Millisecond}, 0)
	})
	b.Run("keys=100", func(b *testing.B) { benchLatency(b, nil, 100) })
}

// benchLatency publishes 3,000 events at 1,000/s, keyed by keys keys (none for 0).
func benchLatency(b *testing.B, cfg *relay.Config, keys int) {
	runLatency(b, benchOutbox(b), cfg, keys, 3000).report(b, "")
}

// latencyRun is what runLatency measured.
type latencyRun struct {
	lat           []time.Duration // sorted
	events        int
	elapsed       time.Duration
	claims, empty int64
	cpu           []int64 // clock ticks: the relay's backends, the producer's, the server's
}

// ms returns the q-quantile of the latencies in milliseconds.
func (r latencyRun) ms(q float64) float64 {
	i := min(int(float64(len(r.lat))*q), len(r.lat)-1)
	return float64(r.lat[i].Microseconds()) / 1000
}

// report reports r's figures, their names prefixed with prefix.
func (r latencyRun) report(b *testing.B, prefix string) {
	b.ReportMetric(r.ms(0.5), prefix+"p50_ms")
	b.ReportMetric(r.ms(0.99), prefix+"p99_ms")
	b.ReportMetric(r.ms(1), prefix+"max_ms")
	b.ReportMetric(float64(r.claims)/r.elapsed.Seconds(), prefix+"claims/s")
	b.ReportMetric(100*float64(r.empty)/float64(max(r.claims, 1)), prefix+"empty_claims_%")
	if r.cpu[2] > 0 { // a local server
		for i, name := range []string{"relay_db", "producer_db", "server"} {
			b.ReportMetric(float64(r.cpu[i])*1e6/benchtest.ClockTicks/float64(r.events), prefix+name+"_cpu_µs/event")
		}
	}
}

// runLatency publishes events events at 1,000/s into o, keyed by keys keys (none for 0),
// with a relay of cfg running, and measures each one's commit → transport latency.
func runLatency(b *testing.B, o *testOutbox, cfg *relay.Config, keys, events int) latencyRun {
	ctx, cancel := context.WithCancel(context.Background())
	producer, producerCPU := trackedPool(b)
	relayPool, relayCPU := trackedPool(b)
	sink := &latencySink{at: map[uuid.UUID]time.Time{}}
	store := &benchtest.CountingStore{Store: o.storeOn(b, relayPool)}
	relay, err := relay.New(store, sink, cfg)
	if err != nil {
		b.Fatal(err)
	}
	// Warm both pools up, so connecting is not part of the measurement.
	for _, p := range []*pgxpool.Pool{producer, relayPool} {
		if err := p.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
	meters := []benchtest.Meter{benchtest.PIDs("relay", relayCPU.list), benchtest.PIDs("producer", producerCPU.list), benchtest.Processes("postgres")}
	cpu0 := make([]int64, len(meters))
	for i, m := range meters {
		cpu0[i] = m.Read()
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { _ = relay.Run(ctx); close(done) }()
	committed := map[uuid.UUID]time.Time{}
	tick := time.NewTicker(time.Millisecond)
	for i := range events {
		<-tick.C
		var opts []outbox.Option
		if keys > 0 {
			opts = append(opts, outbox.WithKey("customer-"+strconv.Itoa(i%keys)))
		}
		e := outbox.New(order{1, 42}, opts...)
		if err := pgx.BeginFunc(ctx, producer, func(tx pgx.Tx) error { return o.Publish(ctx, tx, e) }); err != nil {
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
		time.Sleep(time.Millisecond)
	}
	r := latencyRun{events: events, elapsed: time.Since(start), cpu: make([]int64, len(meters))}
	for i, m := range meters {
		if c := m.Read(); c >= 0 && cpu0[i] >= 0 {
			r.cpu[i] = c - cpu0[i]
		}
	}
	cancel()
	<-done
	for id, c := range committed {
		if at, ok := sink.at[id]; ok {
			r.lat = append(r.lat, max(0, at.Sub(c)))
		}
	}
	if len(r.lat) != len(committed) {
		b.Fatalf("%d of %d events arrived", len(r.lat), len(committed))
	}
	slices.Sort(r.lat)
	r.claims, r.empty = store.Claims.Load(), store.Empty.Load()
	return r
}

// backends records the process IDs of a pool's PostgreSQL backends.
type backends struct {
	mu   sync.Mutex
	pids []int
}

// trackedPool opens a pool on the test server whose backends' process IDs are recorded;
// it is closed when b ends.
func trackedPool(b *testing.B) (*pgxpool.Pool, *backends) {
	cfg, err := pgxpool.ParseConfig(pgxtest.URL())
	if err != nil {
		b.Fatal(err)
	}
	be := &backends{}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		be.mu.Lock()
		defer be.mu.Unlock()
		be.pids = append(be.pids, int(c.PgConn().PID()))
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool, be
}

// list returns the process IDs recorded so far.
func (be *backends) list() []int {
	be.mu.Lock()
	defer be.mu.Unlock()
	return slices.Clone(be.pids)
}
