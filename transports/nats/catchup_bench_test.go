package outboxnats_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// BenchmarkCatchUp measures a relay catching up after a broker outage, with the default
// relay configuration: a relay runs against a private nats-server (file storage) that is
// down while the events accumulate in the outbox (the relay pauses and probes meanwhile,
// spending no attempts), then the server comes back and the relay drains the backlog.
// For each shape — keyless, and keyed by 1,000 keys — it reports:
//
//   - catch-up_events/s: the events over the time from the restart until the stream holds
//     the last one (this includes the wait for the relay's next probe, at most
//     MaxUnavailableBackoff: 10s); drain_events/s: the same from the relay's first
//     successful send after the restart, which first-send_s measures from the restart;
//   - oldest-delay_s: how long the oldest event waited, from its commit until its send
//     succeeded;
//   - outbox_MB: the outbox table with its indexes at the restart, after the drain, and
//     after a VACUUM (a drained table keeps its pages until vacuumed: the space becomes
//     reusable, not smaller);
//   - dead_letters, which must be 0.
//
// The number of events is $TXOUTBOX_CATCHUP_EVENTS (default 500,000); b.N is ignored, so
// run it once:
//
//	go test -run '^$' -bench BenchmarkCatchUp -benchtime 1x -timeout 60m
func BenchmarkCatchUp(b *testing.B) {
	n := 500_000
	if v := os.Getenv("TXOUTBOX_CATCHUP_EVENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("TXOUTBOX_CATCHUP_EVENTS=%q is not a positive number", v)
		}
	}
	for _, shape := range []struct {
		name string
		keys int
	}{{"keyless", 0}, {"keys=1000", 1000}} {
		b.Run(shape.name, func(b *testing.B) { catchUp(b, n, shape.keys) })
	}
}

func catchUp(b *testing.B, n, keys int) {
	srv := startNATSServer(b)
	_, js := connectPrivate(b, srv, "catch-up relay")
	ctx := context.Background()
	id := unique()
	top := outboxnats.Topology{Stream: "CATCHUP_" + id, Subjects: []string{"catchup." + id + ".>"}}
	stream, _, err := outboxnats.Provision(ctx, js, top)
	if err != nil {
		b.Fatal(err)
	}
	ns, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{SubjectPrefix: "catchup." + id, Stream: top.Stream})
	if err != nil {
		b.Fatal(err)
	}
	sender := &firstSends{Sender: ns}
	o := pgxtest.New(b, "outboxnats")
	store, err := o.NewStore(o.Pool)
	if err != nil {
		b.Fatal(err)
	}
	relay, err := relay.New(store, sender, &relay.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}

	srv.Kill()
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			b.Error(err)
		}
	}()

	// The backlog, written while the broker is down, in transactions of 1,000 events.
	filled := time.Now()
	for start := 0; start < n; start += 1000 {
		events := make([]outbox.Encodable, 0, 1000)
		for i := start; i < min(start+1000, n); i++ {
			key := ""
			if keys > 0 {
				key = "acct-" + strconv.Itoa(i%keys)
			}
			e := outbox.New(orderPlaced{OrderID: "o-" + strconv.Itoa(i), Note: "written during the outage"}, outbox.WithKey(key))
			if i == 0 {
				sender.watch(e.ID)
			}
			events = append(events, e)
		}
		o.Commit(b, events...)
	}
	b.Logf("%d events written in %v while the broker was down", n, time.Since(filled).Round(time.Millisecond))
	for wait := time.Now(); relay.State().BrokerUnavailableSince.IsZero(); time.Sleep(5 * time.Millisecond) {
		if time.Since(wait) > 10*time.Second {
			b.Fatal("the relay does not report the broker unavailable")
		}
	}
	before := outboxMB(b, o)

	srv.Start()
	restarted := time.Now()
	for streamMsgs(b, stream) < uint64(n) || o.Count(b, "outbox") > 0 {
		if time.Since(restarted) > 30*time.Minute {
			b.Fatalf("after 30 minutes the stream holds %d of %d events", streamMsgs(b, stream), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	done := time.Now()
	after := outboxMB(b, o)
	if _, err := o.Pool.Exec(ctx, "VACUUM "+o.Schema+".outbox"); err != nil {
		b.Fatal(err)
	}
	vacuumed := outboxMB(b, o)
	first, oldest := sender.times()
	dead := o.Count(b, "outbox_dead_letters")

	b.ReportMetric(float64(n)/done.Sub(restarted).Seconds(), "catch-up_events/s")
	b.ReportMetric(float64(n)/done.Sub(first).Seconds(), "drain_events/s")
	b.ReportMetric(first.Sub(restarted).Seconds(), "first-send_s")
	b.ReportMetric(oldest.Seconds(), "oldest-delay_s")
	b.ReportMetric(before, "outbox-at-restart_MB")
	b.ReportMetric(after, "outbox-drained_MB")
	b.ReportMetric(vacuumed, "outbox-vacuumed_MB")
	b.ReportMetric(float64(dead), "dead_letters")
	if dead != 0 {
		b.Errorf("%d dead letters after a broker outage, want 0", dead)
	}
}

// outboxMB is the size of o's outbox table with its indexes, in MB.
func outboxMB(b *testing.B, o *pgxtest.Outbox) float64 {
	var size int64
	if err := o.Pool.QueryRow(context.Background(), "SELECT pg_total_relation_size($1::regclass)", o.Schema+".outbox").Scan(&size); err != nil {
		b.Fatal(err)
	}
	return float64(size) / 1e6
}

// firstSends records when a send first succeeded, and when the event watched was sent.
type firstSends struct {
	outbox.Sender
	mu      sync.Mutex
	watched uuid.UUID
	created time.Time
	first   time.Time
	oldest  time.Duration
}

func (s *firstSends) watch(id uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watched, s.created = id, time.Now()
}

func (s *firstSends) Send(ctx context.Context, msgs []outbox.Message) error {
	err := s.Sender.Send(ctx, msgs)
	if err != nil {
		return err
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first.IsZero() {
		s.first = now
	}
	for _, m := range msgs {
		if m.ID == s.watched && s.oldest == 0 {
			s.oldest = now.Sub(s.created)
		}
	}
	return nil
}

func (s *firstSends) times() (first time.Time, oldest time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first, s.oldest
}
