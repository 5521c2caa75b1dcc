package benchtest

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
)

// KeyShape is how the events of a drain benchmark's backlog are keyed: Keys distinct keys
// round-robin, 0 for none.
type KeyShape struct {
	Name string
	Keys int
}

// KeyShapes are DrainKeys' backlogs of n events: keyless, all keys distinct, then 1,000,
// 100, 10 and 1 keys.
func KeyShapes(n int) []KeyShape {
	return []KeyShape{{"keyless", 0}, {"distinct", n}, {"1000", 1000}, {"100", 100}, {"10", 10}, {"1", 1}}
}

// DrainKeys measures, for each shape of KeyShapes(n) (or those named in
// $TXOUTBOX_BENCH_KEYS, e.g. "keyless,1"), drain: it fills a fresh outbox with n events,
// event i keyed key(i), drains it and returns events/s. Each keyed shape is drained right
// after a keyless backlog, and its rate is reported with its ratio to that keyless one, so
// that load from elsewhere on the machine, which drifts over a run, weighs on both; the
// keyless rate reported is the median of those. It ignores b.N: run it with -benchtime 1x.
func DrainKeys(b *testing.B, n int, drain func(b *testing.B, key func(i int) string) float64) {
	b.Helper()
	keyOf := func(shape KeyShape) func(int) string {
		return func(i int) string {
			if shape.Keys == 0 {
				return ""
			}
			return "order-" + strconv.Itoa(i%shape.Keys)
		}
	}
	only := os.Getenv("TXOUTBOX_BENCH_KEYS")
	var keyless []float64
	for _, shape := range KeyShapes(n) {
		if only != "" && !slices.Contains(strings.Split(only, ","), shape.Name) {
			continue
		}
		base := drain(b, keyOf(KeyShape{}))
		keyless = append(keyless, base)
		if shape.Keys == 0 {
			continue
		}
		r := drain(b, keyOf(shape))
		b.ReportMetric(r, "keys="+shape.Name+"_events/s")
		b.ReportMetric(r/base, "keys="+shape.Name+"/keyless")
	}
	if len(keyless) > 0 {
		slices.Sort(keyless)
		b.ReportMetric(keyless[len(keyless)/2], "keyless_events/s")
	}
}

// DrainRelay runs a relay with cfg over store, sending to a transport that accepts
// everything, until it has delivered n events or limit has passed, and returns the events
// delivered per second. The transport keeps key order within a call ([Discard]), so the relay
// sends a key's run in one call; with $TXOUTBOX_BENCH_WAVES set it does not
// ([DiscardInWaves]), so the relay sends one message of each key per call. With
// $TXOUTBOX_BENCH_DEBUG set it logs the claims it made.
func DrainRelay(b *testing.B, store outboxdriver.Store, n int, cfg *relay.Config, limit time.Duration) float64 {
	b.Helper()
	sink := &CountingSender{Sender: Discard{}}
	if os.Getenv("TXOUTBOX_BENCH_WAVES") != "" { // what a transport that cannot keep key order gets
		sink.Sender = DiscardInWaves{}
	}
	counted := &CountingStore{Store: store}
	relay, err := relay.New(counted, sink, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() { _ = relay.Run(ctx); close(done) }()
	for sink.Sent() < int64(n) && time.Since(start) < limit {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	<-done
	if os.Getenv("TXOUTBOX_BENCH_DEBUG") != "" {
		b.Logf("%d claims, %d empty, %d partial; %v claiming, %v completing (all loops), %v in all",
			counted.Claims.Load(), counted.Empty.Load(), counted.Partial.Load(),
			time.Duration(counted.claimNS.Load()), time.Duration(counted.completeNS.Load()), elapsed.Round(time.Millisecond))
	}
	return float64(min(sink.Sent(), int64(n))) / elapsed.Seconds()
}

// CountingStore counts the claims a relay makes, the empty ones, and the partial ones (fewer
// rows than the limit, but some).
type CountingStore struct {
	outboxdriver.Store
	Claims, Empty, Partial atomic.Int64
	claimNS, completeNS    atomic.Int64
}

// Claim implements outboxdriver.Store.
func (s *CountingStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	start := time.Now()
	c, err := s.Store.Claim(ctx, p)
	s.claimNS.Add(int64(time.Since(start)))
	s.Claims.Add(1)
	if len(c) == 0 {
		s.Empty.Add(1)
	} else if len(c) < p.Limit {
		s.Partial.Add(1)
	}
	return c, err
}

// Complete implements outboxdriver.Store.
func (s *CountingStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	start := time.Now()
	err := s.Store.Complete(ctx, token, seqs)
	s.completeNS.Add(int64(time.Since(start)))
	return err
}
