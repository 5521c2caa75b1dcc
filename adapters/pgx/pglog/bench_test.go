package outboxpglog_test

// The log relay against the polling relay, on one private server (wal_level = logical) per
// run, the same relay.Config (defaults), the same producers and the same transport (one that
// records when each event reached it). Each sub-benchmark ignores b.N:
//
//	flock /work/wt/bench.lock go test -run '^$' -bench LogRelay -benchtime 1x -timeout 3h -v ./pglog
//
// (-v: without it, go test keeps only the first 10 lines each logs: the relays' logs and
// the duplicates are there.)
//
//   - rate=1k: events committed one per transaction (or $TXOUTBOX_BENCH_EVENTS_PER_TX) at
//     1,000/s for $TXOUTBOX_BENCH_RATE_FOR (default 20s) per relay after a 3s warm-up:
//     database CPU per event of the relay's backends (the log relay's include its lock
//     connection and its slot's walsender) and commit → transport latency. Run it with
//     -count 3 for several runs.
//   - backlog=100k and backlog=1M (the second only with $TXOUTBOX_BENCH_1M set): a backlog
//     committed with COPY while no relay runs (the log relay's slot exists, confirmed
//     before the backlog: a relay that restarts after a stop), a CHECKPOINT, then a relay
//     started and timed until the table is empty.
//   - outage: producers at 1,000/s, a broker that is unavailable for $TXOUTBOX_BENCH_OUTAGE
//     (default 10m): the WAL the slot retains, sampled every second, the backlog when the
//     broker returns and how long the relay takes to deliver it (producers go on). The
//     relays of $TXOUTBOX_BENCH_OUTAGE_MODES (default "log"; "log,poll" for both: polling
//     has no slot).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pglog"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/benchtest"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
)

func BenchmarkLogRelay(b *testing.B) {
	if testing.Short() {
		b.Skip("a benchmark of minutes: not under -short")
	}
	srv := pgxtest.StartServer(b, pgxtest.LogicalSettings...)
	b.Run("rate=1k", func(b *testing.B) {
		d := envDuration(b, "TXOUTBOX_BENCH_RATE_FOR", 20*time.Second)
		poll := measureRate(b, srv, "poll", d)
		log := measureRate(b, srv, "log", d)
		for _, r := range []rateRun{poll, log} {
			r.report(b)
		}
		b.ReportMetric(log.relayCPU/poll.relayCPU, "log/poll_relay_db_cpu")
	})
	b.Run("backlog=100k", func(b *testing.B) { benchDrain(b, srv, 100_000) })
	b.Run("backlog=1M", func(b *testing.B) {
		if os.Getenv("TXOUTBOX_BENCH_1M") == "" {
			b.Skip("set TXOUTBOX_BENCH_1M to drain a backlog of a million events")
		}
		benchDrain(b, srv, 1_000_000)
	})
	b.Run("outage", func(b *testing.B) {
		d := envDuration(b, "TXOUTBOX_BENCH_OUTAGE", 10*time.Minute)
		modes := cmp.Or(os.Getenv("TXOUTBOX_BENCH_OUTAGE_MODES"), "log")
		for _, mode := range strings.Split(modes, ",") {
			measureOutage(b, srv, mode, d).report(b)
		}
	})
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("$%s: %v", name, err)
	}
	return d
}

// benchEvent is the benchmarks' event.
type benchEvent struct {
	N     int64
	Total int64
}

func (benchEvent) EventType() string { return "bench.order_placed" }

// underTest is one relay ("poll" or "log") over an outbox of its own on the server, with a
// pool whose backends (and, for the log relay, its lock connection and walsender) are
// tagged, so that their CPU time can be read from /proc.
type underTest struct {
	mode     string
	o        *pgxtest.Outbox
	store    outboxdriver.Store
	logStore *outboxpglog.Store // nil for "poll"
	cfg      *outboxpglog.Config
	pool     *pgxpool.Pool // the relay's
	backends func() []int
	logs     *logLines
}

func newUnderTest(b *testing.B, srv *pgxtest.Server, mode string) *underTest {
	b.Helper()
	ctx := context.Background()
	u := &underTest{mode: mode, o: pgxtest.NewOn(b, srv.URL(), mode), logs: &logLines{}}
	pool, backends := pgxtest.TaggedPoolOn(b, srv.URL(), 0)
	u.pool, u.backends = pool, backends
	var err error
	switch mode {
	case "poll":
		u.store, err = u.o.NewStore(pool)
	case "log":
		// Default config but for the logger, and the slot's name spelled out for ReadSlot.
		u.cfg = &outboxpglog.Config{Tables: outbox.Tables{Schema: u.o.Schema}, Slot: u.o.Schema + "_slot", Logger: u.logs.logger()}
		if d, err := time.ParseDuration(os.Getenv("TXOUTBOX_BENCH_DELETE_INTERVAL")); err == nil {
			u.cfg.DeleteInterval = d // default 10ms
		}
		if err := outboxpglog.CreatePublication(ctx, u.o.Pool, u.cfg); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := outboxpglog.Drop(context.Background(), u.o.Pool, u.cfg); err != nil {
				b.Error(err)
			}
		})
		u.logStore, err = outboxpglog.NewStore(pool, u.cfg)
		u.store = u.logStore
	}
	if err != nil {
		b.Fatal(err)
	}
	return u
}

// start runs a relay (default config, logs kept) over u's store to s until the returned
// function is called; for the log relay it first waits until the store streams (or, with
// ready false, returns at once).
func (u *underTest) start(b *testing.B, s *sink, ready bool) (stop func()) {
	b.Helper()
	r, err := relay.New(u.store, s, &relay.Config{Logger: u.logs.logger()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if ready && u.logStore != nil {
		u.waitMode(b, "stream", time.Minute)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("%s relay: %v", u.mode, err)
		}
	}
}

// waitMode waits until the log store is in mode m and returns how long that took.
func (u *underTest) waitMode(b *testing.B, m string, limit time.Duration) time.Duration {
	b.Helper()
	start := time.Now()
	for u.logStore.Mode() != m {
		if time.Since(start) > limit {
			b.Fatalf("the log store is still in mode %s after %v", u.logStore.Mode(), limit)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// cpu returns the CPU time (clock ticks) of the relay's backends so far, or -1.
func (u *underTest) cpu() int64 { return benchtest.PIDs("relay", u.backends).Read() }

// walsenders returns the PIDs of the relay's walsenders (none for polling).
func (u *underTest) walsenders() []int {
	var pids []int
	err := u.o.Pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
 WHERE pid = ANY ($1) AND backend_type = 'walsender'`, u.backends()).Scan(&pids)
	if err != nil {
		return nil
	}
	return pids
}

// backendKinds names the relay's backends by type ("client backend", "walsender").
func (u *underTest) backendKinds() string {
	var kinds string
	err := u.o.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(backend_type || ' ' || pid, ', ' ORDER BY backend_type, pid), '')
  FROM pg_stat_activity WHERE pid = ANY ($1)`, u.backends()).Scan(&kinds)
	if err != nil {
		return err.Error()
	}
	return kinds
}

// undeleted returns how many rows of u's outbox the transport received more than a second
// ago: delivered, yet not deleted.
func (u *underTest) undeleted(b *testing.B, s *sink) int {
	rows, err := u.o.Pool.Query(context.Background(), "SELECT id FROM "+u.o.Schema+".outbox")
	if err != nil {
		b.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		b.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if at, ok := s.at[id]; ok && time.Since(at) > time.Second {
			n++
		}
	}
	return n
}

// count returns the rows in u's outbox.
func (u *underTest) count(b *testing.B) int64 {
	var n int64
	if err := u.o.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+u.o.Schema+".outbox").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// empty reports whether u's outbox is empty, through its primary key (a count would read
// every dead row a drain leaves).
func (u *underTest) empty(b *testing.B) bool {
	var seq *int64
	if err := u.o.Pool.QueryRow(context.Background(), "SELECT min(seq) FROM "+u.o.Schema+".outbox").Scan(&seq); err != nil {
		b.Fatal(err)
	}
	return seq == nil
}

// drop removes u's outbox now (not when b ends: a drained backlog crowds the server's
// buffers), with its slot and publication.
func (u *underTest) drop(b *testing.B) {
	ctx := context.Background()
	if u.cfg != nil {
		if err := outboxpglog.Drop(ctx, u.o.Pool, u.cfg); err != nil {
			b.Error(err)
		}
	}
	if _, err := u.o.Pool.Exec(ctx, "DROP SCHEMA "+u.o.Schema+" CASCADE"); err != nil {
		b.Error(err)
	}
	u.pool.Close()
}

// logLines keeps the relay's and the store's logs.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimSpace(string(p)))
	return len(p), nil
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// since returns the lines logged (all of them, up to 40; the rest counted) and the mode
// changes among those after the first n.
func (l *logLines) since(n int) (shown []string, total, modeChanges int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, line := range l.lines {
		total++
		if i >= n && strings.Contains(line, "changes mode") {
			modeChanges++
		}
		if len(shown) < 40 {
			shown = append(shown, line)
		}
	}
	return shown, total, modeChanges
}

func (l *logLines) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// logSince logs what u's relay and store logged after the first n lines.
func (u *underTest) logSince(b *testing.B, what string, n int) int {
	shown, total, changes := u.logs.since(n)
	b.Logf("%s: %d log lines since the relay started; %d mode changes %s", u.mode, total, changes, what)
	for _, line := range shown {
		b.Logf("  %s", line)
	}
	if total > len(shown) {
		b.Logf("  … %d more", total-len(shown))
	}
	return changes
}

// sink is the transport: it records when each event reached it (when record is set),
// counts what it accepted, and fails every send as unavailable while down is set.
type sink struct {
	record   bool
	down     atomic.Bool
	sent     atomic.Int64
	dups     atomic.Int64 // events that arrived again (recorded ones only)
	dupNotes []string     // the first few
	mu       sync.Mutex
	at       map[uuid.UUID]time.Time
	// pending, when set, are events waited for: done is closed when the last arrives.
	pending map[uuid.UUID]bool
	done    chan struct{}
}

func newSink(record bool) *sink { return &sink{record: record, at: map[uuid.UUID]time.Time{}} }

func (s *sink) Send(_ context.Context, msgs []outbox.Message) error {
	if s.down.Load() {
		return outbox.Unavailable(errors.New("the broker is down (benchmark)"))
	}
	now := time.Now()
	s.sent.Add(int64(len(msgs)))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if s.record {
			if first, ok := s.at[m.ID]; ok {
				if s.dups.Add(1) <= 5 {
					s.dupNotes = append(s.dupNotes, fmt.Sprintf("%s first at %s, again at %s", m.Body, first.Format("15:04:05.000"), now.Format("15:04:05.000")))
				}
				continue
			}
			s.at[m.ID] = now
		}
		if s.pending != nil && s.pending[m.ID] {
			delete(s.pending, m.ID)
			if len(s.pending) == 0 {
				close(s.done)
				s.pending = nil
			}
		}
	}
	return nil
}

// KeepsKeyOrder reports true ([outbox.KeyOrderer]): the relay sends a whole batch per call.
func (*sink) KeepsKeyOrder() bool { return true }

// duplicates logs the first duplicates s received and returns how many it received.
func (s *sink) duplicates(b *testing.B, mode string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.dupNotes {
		b.Logf("%s: duplicate %s", mode, n)
	}
	return s.dups.Load()
}

// await returns a channel closed once every event in ids has arrived.
func (s *sink) await(ids []uuid.UUID) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	done := make(chan struct{})
	pending := map[uuid.UUID]bool{}
	for _, id := range ids {
		if _, ok := s.at[id]; !ok {
			pending[id] = true
		}
	}
	if len(pending) == 0 {
		close(done)
	} else {
		s.pending, s.done = pending, done
	}
	return done
}

// arrived returns how many of ids reached s.
func (s *sink) arrived(ids []uuid.UUID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if _, ok := s.at[id]; ok {
			n++
		}
	}
	return n
}

// producers commit one event per transaction, paced, from several goroutines (a commit
// waits for its WAL flush: one goroutine alone would fall behind), through a tagged pool.
type producers struct {
	o        *pgxtest.Outbox
	pool     *pgxpool.Pool
	backends func() []int
	mu       sync.Mutex
	ids      []uuid.UUID
	at       map[uuid.UUID]time.Time // commit returned
	late     atomic.Int64            // commits that began more than 10 ms after their time
	perTx    int                     // events in one transaction (TXOUTBOX_BENCH_EVENTS_PER_TX, default 1)
}

const producerWorkers = 8

func newProducers(b *testing.B, srv *pgxtest.Server, o *pgxtest.Outbox) *producers {
	pool, backends := pgxtest.TaggedPoolOn(b, srv.URL(), producerWorkers)
	if err := pool.Ping(context.Background()); err != nil {
		b.Fatal(err)
	}
	perTx, _ := strconv.Atoi(os.Getenv("TXOUTBOX_BENCH_EVENTS_PER_TX"))
	return &producers{o: o, pool: pool, backends: backends, at: map[uuid.UUID]time.Time{}, perTx: max(perTx, 1)}
}

// run commits events at perSecond, p.perTx to a transaction, until d has passed or ctx
// ends, transaction i due at start + i·perTx/perSecond, and returns how many events it
// committed.
func (p *producers) run(ctx context.Context, b *testing.B, perSecond int, d time.Duration) int {
	interval := time.Second * time.Duration(p.perTx) / time.Duration(perSecond)
	start := time.Now()
	var next, done atomic.Int64
	var wg sync.WaitGroup
	for range producerWorkers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				due := start.Add(time.Duration(i) * interval)
				if due.Sub(start) >= d {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(due)):
				}
				if time.Since(due) > 10*time.Millisecond {
					p.late.Add(1)
				}
				events := make([]outbox.Encodable, p.perTx)
				ids := make([]uuid.UUID, p.perTx)
				for j := range events {
					e := outbox.New(benchEvent{N: i*int64(p.perTx) + int64(j), Total: 42})
					events[j], ids[j] = e, e.ID
				}
				if err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return p.o.Publish(ctx, tx, events...) }); err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				now := time.Now()
				p.mu.Lock()
				p.ids = append(p.ids, ids...)
				for _, id := range ids {
					p.at[id] = now
				}
				p.mu.Unlock()
				done.Add(int64(p.perTx))
			}
		})
	}
	wg.Wait()
	return int(done.Load())
}

// committed returns the IDs committed so far.
func (p *producers) committed() []uuid.UUID {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ids)
}

// reset forgets the events committed so far.
func (p *producers) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids, p.at = nil, map[uuid.UUID]time.Time{}
	p.late.Store(0)
}

// rateRun is what measureRate measured of one relay.
type rateRun struct {
	mode                  string
	events                int
	perSecond             float64 // committed
	late                  int64
	lat                   []time.Duration // sorted
	relayCPU, producerCPU float64         // µs per event
	walsenderCPU          float64         // µs per event, of relayCPU: the log relay's walsender
	modeChanges           int
	dups                  int64 // events the transport received twice
}

func (r rateRun) ms(q float64) float64 {
	i := min(int(float64(len(r.lat))*q), len(r.lat)-1)
	return float64(r.lat[i].Microseconds()) / 1000
}

func (r rateRun) report(b *testing.B) {
	b.ReportMetric(r.ms(0.5), r.mode+"_p50_ms")
	b.ReportMetric(r.ms(0.99), r.mode+"_p99_ms")
	b.ReportMetric(r.ms(1), r.mode+"_max_ms")
	b.ReportMetric(r.relayCPU, r.mode+"_relay_db_µs/event")
	b.ReportMetric(r.producerCPU, r.mode+"_producer_db_µs/event")
	if r.mode == "log" {
		b.ReportMetric(r.walsenderCPU, "log_walsender_db_µs/event")
	}
	b.ReportMetric(float64(r.modeChanges), r.mode+"_mode_changes")
	b.ReportMetric(float64(r.dups), r.mode+"_duplicates")
	b.Logf("%s: %d events at %.0f/s (%d began >10ms late), p50 %.3f ms, p99 %.3f ms, max %.3f ms; relay's backends %.1f µs/event, producers' %.1f µs/event; %d mode changes; %d duplicates",
		r.mode, r.events, r.perSecond, r.late, r.ms(0.5), r.ms(0.99), r.ms(1), r.relayCPU, r.producerCPU, r.modeChanges, r.dups)
}

// running starts a relay of mode, streaming if it is the log relay, on an outbox of its own
// with producers and a recording transport; done stops the relay and drops the outbox.
func running(b *testing.B, srv *pgxtest.Server, mode string) (u *underTest, p *producers, s *sink, done func()) {
	u = newUnderTest(b, srv, mode)
	p = newProducers(b, srv, u.o)
	s = newSink(true)
	stop := u.start(b, s, true)
	return u, p, s, func() {
		stop()
		p.pool.Close()
		u.drop(b)
	}
}

// measureRate runs one relay while producers commit at 1,000 events/s: 3s of warm-up, then d
// measured.
func measureRate(b *testing.B, srv *pgxtest.Server, mode string, d time.Duration) rateRun {
	ctx := context.Background()
	u, p, s, done := running(b, srv, mode)
	defer done()
	p.run(ctx, b, 1000, 3*time.Second)
	waitArrived(b, s, p.committed(), 30*time.Second)
	p.reset()
	logsAt := u.logs.len()
	wal := benchtest.PIDs("walsender", u.walsenders)
	relay0, prod0, wal0 := u.cpu(), benchtest.PIDs("producer", p.backends).Read(), wal.Read()
	start := time.Now()
	n := p.run(ctx, b, 1000, d)
	committedFor := time.Since(start)
	waitArrived(b, s, p.committed(), 30*time.Second)
	relay1, prod1, wal1 := u.cpu(), benchtest.PIDs("producer", p.backends).Read(), wal.Read()
	b.Logf("%s relay's backends at the end: %s", mode, u.backendKinds())
	time.Sleep(1100 * time.Millisecond)
	b.Logf("%s: %d rows delivered more than 1s ago are still in the table", mode, u.undeleted(b, s))
	r := rateRun{mode: mode, events: n, perSecond: float64(n) / committedFor.Seconds(), late: p.late.Load(),
		relayCPU: perEvent(relay0, relay1, n), producerCPU: perEvent(prod0, prod1, n), walsenderCPU: perEvent(wal0, wal1, n)}
	r.modeChanges = u.logSince(b, "during the measurement", logsAt)
	r.dups = s.duplicates(b, mode)
	s.mu.Lock()
	for _, id := range p.ids {
		r.lat = append(r.lat, max(0, s.at[id].Sub(p.at[id])))
	}
	s.mu.Unlock()
	slices.Sort(r.lat)
	return r
}

// perEvent is the CPU time between two readings, in µs per event; -1 when unknown.
func perEvent(c0, c1 int64, events int) float64 {
	if c0 < 0 || c1 < 0 || events == 0 {
		return -1
	}
	return float64(c1-c0) * 1e6 / benchtest.ClockTicks / float64(events)
}

// waitArrived waits until every event of ids reached s.
func waitArrived(b *testing.B, s *sink, ids []uuid.UUID, limit time.Duration) {
	b.Helper()
	select {
	case <-s.await(ids):
	case <-time.After(limit):
		b.Fatalf("%d of %d events arrived within %v", s.arrived(ids), len(ids), limit)
	}
}

// drainRun is what measureDrain measured of one relay.
type drainRun struct {
	mode           string
	events         int
	fill, elapsed  time.Duration
	relayCPU       float64 // µs per event
	toStream       time.Duration
	modeChanges    int
	rate           float64
	sentAt, emptAt time.Duration
}

// benchDrain drains a backlog of n events with each relay and reports their rates.
func benchDrain(b *testing.B, srv *pgxtest.Server, n int) {
	poll := measureDrain(b, srv, "poll", n, false)
	log := measureDrain(b, srv, "log", n, false)
	fresh := measureDrain(b, srv, "log", n, true)
	fresh.mode = "log_newslot"
	for _, r := range []drainRun{poll, log, fresh} {
		b.ReportMetric(r.rate, r.mode+"_events/s")
		b.ReportMetric(r.relayCPU, r.mode+"_relay_db_µs/event")
		b.ReportMetric(float64(r.modeChanges), r.mode+"_mode_changes")
		b.Logf("%s: %d events committed in %v; all sent after %v, table empty after %v: %.0f events/s; relay's backends %.1f µs/event; %d mode changes; streaming %v after the table was empty",
			r.mode, r.events, r.fill.Round(time.Millisecond), r.sentAt.Round(time.Millisecond), r.emptAt.Round(time.Millisecond),
			r.rate, r.relayCPU, r.modeChanges, r.toStream.Round(time.Millisecond))
	}
	b.ReportMetric(log.rate/poll.rate, "log/poll_rate")
	b.ReportMetric(fresh.rate/poll.rate, "log_newslot/poll_rate")
}

// measureDrain commits a backlog of n events with COPY (10,000 a transaction), checkpoints,
// and times a relay from its start until the table is empty. The log relay's slot is
// created first, by a relay that streams and stops: the slot is confirmed before the
// backlog and the walsender decodes it all during the drain; with newSlot, the relay
// creates it when it starts, after the backlog (a first start on a full table).
func measureDrain(b *testing.B, srv *pgxtest.Server, mode string, n int, newSlot bool) drainRun {
	ctx := context.Background()
	u := newUnderTest(b, srv, mode)
	defer u.drop(b)
	s := newSink(false)
	if u.logStore != nil && !newSlot {
		u.start(b, s, true)()
	}
	fillStart := time.Now()
	const chunk = 10000
	events := make([]outbox.Encodable, 0, chunk)
	for i := 0; i < n; i += chunk {
		events = events[:0]
		for j := i; j < min(n, i+chunk); j++ {
			events = append(events, outbox.New(benchEvent{N: int64(j), Total: 42}))
		}
		if err := pgx.BeginFunc(ctx, u.o.Pool, func(tx pgx.Tx) error { return u.o.Publish(ctx, tx, events...) }); err != nil {
			b.Fatal(err)
		}
	}
	r := drainRun{mode: mode, events: n, fill: time.Since(fillStart)}
	for _, q := range []string{"VACUUM ANALYZE " + u.o.Schema + ".outbox", "CHECKPOINT"} {
		if _, err := u.o.Pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	logsAt := u.logs.len()
	cpu0 := u.cpu()
	start := time.Now()
	stop := u.start(b, s, false)
	defer stop()
	for s.sent.Load() < int64(n) {
		if time.Since(start) > time.Hour {
			b.Fatalf("%d of %d events sent within an hour", s.sent.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	r.sentAt = time.Since(start)
	for !u.empty(b) {
		time.Sleep(5 * time.Millisecond)
	}
	r.emptAt = time.Since(start)
	r.relayCPU = perEvent(cpu0, u.cpu(), n)
	r.rate = float64(n) / r.emptAt.Seconds()
	if u.logStore != nil {
		r.toStream = u.waitMode(b, "stream", time.Minute)
	}
	r.modeChanges = u.logSince(b, fmt.Sprintf("draining %d", n), logsAt)
	return r
}

// outageRun is what measureOutage measured of one relay.
type outageRun struct {
	mode                      string
	outage                    time.Duration
	committed                 int   // during the outage
	backlog                   int64 // rows in the table when the broker returned
	maxRetained, lastRetained int64 // bytes (log relay), during the outage
	maxRetainedAfter          int64 // bytes, while the relay delivers the backlog
	walWritten                int64 // bytes of WAL the server wrote during the outage
	drain, toStream           time.Duration
	modeChanges               int
	dups                      int64 // events the transport received twice
}

func (r outageRun) report(b *testing.B) {
	b.ReportMetric(float64(r.backlog), r.mode+"_backlog_events")
	b.ReportMetric(r.drain.Seconds(), r.mode+"_drain_s")
	b.ReportMetric(float64(r.modeChanges), r.mode+"_mode_changes")
	b.ReportMetric(float64(r.dups), r.mode+"_duplicates")
	b.ReportMetric(float64(r.walWritten)/(1<<20), r.mode+"_wal_written_MiB")
	if r.mode == "log" {
		b.ReportMetric(float64(r.maxRetained)/(1<<10), "log_max_retained_wal_KiB")
		b.ReportMetric(float64(r.maxRetainedAfter)/(1<<10), "log_max_retained_wal_after_KiB")
	}
	retained := "no slot: polling retains no WAL"
	if r.mode == "log" {
		retained = fmt.Sprintf("the slot retained at most %d bytes of WAL (%d at the end), %d while the relay delivered the backlog", r.maxRetained, r.lastRetained, r.maxRetainedAfter)
	}
	b.Logf("%s: broker down %v, %d events committed meanwhile, %.1f MiB of WAL written; %s; %d rows in the table when it returned, delivered %v later (streaming again after %v); %d mode changes; %d duplicates",
		r.mode, r.outage, r.committed, float64(r.walWritten)/(1<<20), retained, r.backlog, r.drain.Round(time.Millisecond), r.toStream.Round(time.Millisecond), r.modeChanges, r.dups)
}

// measureOutage runs a relay while producers commit at 1,000 events/s and the broker is
// down for d (after 5s up), sampling the slot's retained WAL every second; then the broker
// returns and the producers go on until the relay has delivered everything committed
// before.
func measureOutage(b *testing.B, srv *pgxtest.Server, mode string, d time.Duration) outageRun {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u, p, s, done := running(b, srv, mode)
	defer done()
	var wg sync.WaitGroup
	wg.Go(func() { p.run(ctx, b, 1000, 24*time.Hour) })
	defer wg.Wait()
	defer cancel()

	time.Sleep(5 * time.Second)
	b.Logf("%s: %d rows delivered more than 1s ago are in the table when the broker goes down", mode, u.undeleted(b, s))
	logsAt := u.logs.len()
	r := outageRun{mode: mode, outage: d}
	walAt := func() int64 {
		var lsn int64
		if err := u.o.Pool.QueryRow(ctx, "SELECT pg_current_wal_lsn() - '0/0'").Scan(&lsn); err != nil {
			b.Fatal(err)
		}
		return lsn
	}
	sample := func(after bool) {
		if u.logStore == nil {
			return
		}
		st, err := outboxpglog.ReadSlot(ctx, u.o.Pool, u.cfg.Slot)
		if err != nil {
			b.Error(err)
			return
		}
		if after {
			r.maxRetainedAfter = max(r.maxRetainedAfter, st.RetainedWAL)
		} else {
			r.maxRetained, r.lastRetained = max(r.maxRetained, st.RetainedWAL), st.RetainedWAL
		}
	}
	wal0, before := walAt(), len(p.committed())
	s.down.Store(true)
	start := time.Now()
	for tick := time.NewTicker(time.Second); time.Since(start) < d; <-tick.C {
		sample(false)
		if i := int(time.Since(start) / time.Second); i%60 == 0 {
			b.Logf("%s outage %v: %d rows in the table, retained WAL %d bytes, mode %s",
				mode, time.Since(start).Round(time.Second), u.count(b), r.lastRetained, u.modeOf())
		}
	}
	r.walWritten, r.committed = walAt()-wal0, len(p.committed())-before
	r.backlog = u.count(b)
	ids := p.committed()
	s.down.Store(false)
	back := time.Now()
	arrived := s.await(ids)
	for tick := time.NewTicker(time.Second); ; <-tick.C {
		sample(true)
		select {
		case <-arrived:
		default:
			if time.Since(back) > time.Hour {
				b.Fatalf("%d of %d events arrived within an hour of the broker's return", s.arrived(ids), len(ids))
			}
			continue
		}
		break
	}
	r.drain = time.Since(back)
	if u.logStore != nil {
		r.toStream = time.Since(back) + u.waitMode(b, "stream", 10*time.Minute)
	}
	r.modeChanges = u.logSince(b, "during the outage and after", logsAt)
	r.dups = s.duplicates(b, mode)
	return r
}

// modeOf returns the log store's mode, "poll" for the polling store.
func (u *underTest) modeOf() string {
	if u.logStore == nil {
		return "poll"
	}
	return u.logStore.Mode()
}
