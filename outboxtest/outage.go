package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// Broker is an in-memory broker that can be taken down: while down, every send fails as a
// stopped broker's would (connection refused, marked [outbox.Unavailable]). Tests of what an
// outage does to a relay use it in front of an [outboxmemory.Queue].
type Broker struct {
	*outboxmemory.Queue
	down    atomic.Bool
	refused atomic.Int64
	// reject, when set, fails the messages it returns an error for while the broker is up,
	// as a broker that refuses one message for reasons of the message would.
	reject func(outbox.Message) error
}

// NewBroker returns a broker that is up, over a new queue with cfg (its SendHook is
// replaced).
func NewBroker(cfg *outboxmemory.Config) *Broker {
	b := &Broker{}
	c := outboxmemory.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.SendHook = func(m outbox.Message) error {
		if b.down.Load() {
			b.refused.Add(1)
			return outbox.Unavailable(fmt.Errorf("dial tcp 127.0.0.1:4222: %w", syscall.ECONNREFUSED))
		}
		if b.reject != nil {
			return b.reject(m)
		}
		return nil
	}
	b.Queue = outboxmemory.New(&c)
	return b
}

// Ping fails while the broker is down, as a stopped broker's would.
func (b *Broker) Ping(context.Context) error {
	if b.down.Load() {
		return outbox.Unavailable(fmt.Errorf("dial tcp 127.0.0.1:4222: %w", syscall.ECONNREFUSED))
	}
	return nil
}

// Stop takes the broker down; Start brings it back.
func (b *Broker) Stop()  { b.down.Store(true) }
func (b *Broker) Start() { b.down.Store(false) }

// Refused counts the messages refused while down.
func (b *Broker) Refused() int64 { return b.refused.Load() }

// outageRelay is a relay config whose retry horizon — how long a message failing on its
// own lasts before it is dead-lettered — is MaxAttempts × MaxRetryBackoff = 100ms, and
// which probes an unavailable broker every 20ms at most.
func outageRelay(name string) *relay.Config {
	cfg := fastRelay(name, 5)
	cfg.RetryBackoff, cfg.MaxRetryBackoff = 5*time.Millisecond, 20*time.Millisecond
	cfg.UnavailableBackoff, cfg.MaxUnavailableBackoff = 5*time.Millisecond, 20*time.Millisecond
	return cfg
}

const outageHorizon = 5 * 20 * time.Millisecond // outageRelay's MaxAttempts × MaxRetryBackoff

// relayGroup runs relays until stopped.
type relayGroup struct {
	relays []*relay.Relay
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
}

func startRelays(t testing.TB, store outboxdriver.Store, sender outbox.Sender, n int, cfg *relay.Config) *relayGroup {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &relayGroup{cancel: cancel, errs: make(chan error, n)}
	for i := range n {
		c := *cfg
		c.Name = fmt.Sprintf("%s-%d", cfg.Name, i)
		r := newRelay(t, store, sender, &c)
		g.relays = append(g.relays, r)
		g.wg.Go(func() { g.errs <- r.Run(ctx) })
	}
	t.Cleanup(func() { g.stop(t) })
	return g
}

// stop stops the relays (once) and fails t if one returned an error.
func (g *relayGroup) stop(t testing.TB) {
	t.Helper()
	if g.cancel == nil {
		return
	}
	g.cancel()
	g.cancel = nil
	g.wg.Wait()
	close(g.errs)
	for err := range g.errs {
		if err != nil {
			t.Errorf("relay returned %v", err)
		}
	}
}

// brokerDown reports whether every running relay reports its broker unavailable.
func (g *relayGroup) brokerDown() bool {
	for _, r := range g.relays {
		if r.State().BrokerUnavailableSince.IsZero() {
			return false
		}
	}
	return true
}

func (g *relayGroup) healthy() bool {
	for _, r := range g.relays {
		if !r.State().Healthy() {
			return false
		}
	}
	return true
}

// exerciseOutage runs the store side of "an outage of any length dead-letters nothing":
// the relay's reaction to a broker that is down, over the adapter's real store.
func exerciseOutage(t *testing.T, newFixture func(t *testing.T) *StoreFixture) {
	t.Run("BrokerOutageOfTenRetryHorizonsLosesNothing", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		relays := 3
		if f.SingleRelay {
			relays = 1
		}
		// Keyed events of a few keys and keyless ones, before, during and after the outage.
		var (
			published []outbox.Encodable
			round     int
		)
		publish := func() {
			var events []outbox.Encodable
			for k := range 4 {
				events = append(events, outbox.New(Note{N: round}, outbox.WithKey(fmt.Sprintf("acct-%d", k))))
			}
			events = append(events, outbox.New(Note{N: round}), outbox.New(Note{N: round}))
			mustPublish(t, f, true, events...)
			published = append(published, events...)
			round++
		}
		b := NewBroker(nil)
		g := startRelays(t, f.Store, b, relays, outageRelay("outage"))
		for range 5 {
			publish()
		}
		WaitFor(t, 30*time.Second, "the first events to be delivered", func() bool { return len(b.Sent()) >= len(published) })

		b.Stop()
		downAt := time.Now()
		for range 5 {
			publish()
		}
		WaitFor(t, 30*time.Second, "every relay to report the broker unavailable", g.brokerDown)
		for time.Since(downAt) < 10*outageHorizon {
			publish() // events keep coming while the broker is down
			time.Sleep(outageHorizon / 2)
		}
		if b.Refused() == 0 {
			t.Fatal("no send reached the broker during the outage")
		}
		if got := len(deadLetters(t, f)); got != 0 {
			t.Fatalf("%d dead letters during a broker outage, want 0", got)
		}
		b.Start()
		for range 5 {
			publish()
		}
		WaitFor(t, 30*time.Second, "every event to be delivered after the outage", func() bool {
			return len(ids(b.Sent())) >= len(published)
		})
		WaitFor(t, 10*time.Second, "every relay to report the broker available", g.healthy)
		g.stop(t)
		if got := len(deadLetters(t, f)); got != 0 {
			t.Fatalf("%d dead letters after a broker outage, want 0", got)
		}
		CheckPerKeyOrder(t, published, b.Sent())
		expectPending(t, f, 0)
		t.Logf("%d events, %d relays, broker down %v (10 × a retry horizon of %v), %d sends refused meanwhile",
			len(published), relays, 10*outageHorizon, outageHorizon, b.Refused())
	})

	t.Run("OutageWithHeldKeysReplayedAndDiscarded", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		relays := 3
		if f.SingleRelay {
			relays = 1
		}
		// Two keys' first events are refused by the broker for themselves (before and
		// during an outage ten retry horizons long): each is dead-lettered and holds its key,
		// whose later events wait through the outage. Then one dead letter is replayed — it
		// goes first, then its key's other events — and the other discarded: its key moves
		// on. Everything else is delivered in key order, with no other dead letter.
		var published []outbox.Encodable
		publish := func(events ...outbox.Encodable) {
			mustPublish(t, f, true, events...)
			published = append(published, events...)
		}
		replayed := outbox.New(Note{Text: "replayed", N: 0}, outbox.WithKey("held-replayed"))
		discarded := outbox.New(Note{Text: "discarded", N: 0}, outbox.WithKey("held-discarded"))
		var fixed atomic.Bool
		b := NewBroker(nil)
		b.reject = func(m outbox.Message) error {
			if (m.ID == replayed.ID && !fixed.Load()) || m.ID == discarded.ID {
				return errors.New("rejected by the broker: invalid message attribute")
			}
			return nil
		}
		g := startRelays(t, f.Store, b, relays, outageRelay("held-outage"))
		publish(replayed, discarded, outbox.New(Note{N: 0}, outbox.WithKey("free")), outbox.New(Note{N: 0}))
		WaitFor(t, 30*time.Second, "both refused events to be dead-lettered", func() bool { return len(deadLetters(t, f)) == 2 })
		b.Stop()
		for i := 1; i <= 10; i++ {
			publish(outbox.New(Note{Text: "replayed", N: i}, outbox.WithKey("held-replayed")),
				outbox.New(Note{Text: "discarded", N: i}, outbox.WithKey("held-discarded")),
				outbox.New(Note{N: i}, outbox.WithKey("free")), outbox.New(Note{N: i}))
			time.Sleep(outageHorizon)
		}
		WaitFor(t, 30*time.Second, "every relay to report the broker unavailable", g.brokerDown)
		b.Start()
		sent := func() map[string]int {
			n := map[string]int{}
			for _, m := range b.Sent() {
				n[m.Key]++
			}
			return n
		}
		WaitFor(t, 30*time.Second, "the free key's and the keyless events to be delivered", func() bool {
			s := sent()
			return s["free"] == 11 && s[""] == 11
		})
		if s := sent(); s["held-replayed"] != 0 || s["held-discarded"] != 0 {
			t.Fatalf("held keys' events were delivered while their dead letters were pending: %v", s)
		}
		entries, err := f.DeadLetterTable.List(context.Background(), deadletter.Filter{Status: deadletter.StatusPending})
		if err != nil || len(entries) != 2 {
			t.Fatalf("pending dead letters: %d, %v; want the 2 refused events", len(entries), err)
		}
		for _, e := range entries {
			fixed.Store(true)
			act := f.DeadLetterTable.Replay
			if e.Message.ID == discarded.ID {
				act = f.DeadLetterTable.Discard
			}
			if err := act(context.Background(), e.ID); err != nil {
				t.Fatal(err)
			}
		}
		WaitFor(t, 30*time.Second, "the held keys' events to be delivered", func() bool {
			s := sent()
			return s["held-replayed"] == 11 && s["held-discarded"] == 10
		})
		g.stop(t)
		var first outbox.Message
		for _, m := range b.Sent() {
			if m.Key == "held-replayed" {
				first = m
				break
			}
		}
		if first.ID != replayed.ID {
			t.Fatalf("the replayed dead letter was not the first of its key to be delivered (got %s)", first.ID)
		}
		if got := len(deadLetters(t, f)); got != 2 {
			t.Fatalf("%d dead letters, want the 2 refused events only", got)
		}
		delivered := b.Sent()
		var kept []outbox.Encodable
		for _, e := range published {
			if m, _ := e.Encode(); m.ID != discarded.ID {
				kept = append(kept, e)
			}
		}
		CheckPerKeyOrder(t, kept, delivered)
		expectPending(t, f, 0)
	})

	t.Run("OnlyTheMessagesOwnFailuresCount", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		// While a flaky broker refuses connections every other send, a message the broker
		// rejects for itself still uses its attempts up and is dead-lettered; the others
		// are all delivered.
		var calls atomic.Int64
		rejected := outbox.New(Poison{N: 1})
		var events []outbox.Encodable
		for i := range 30 {
			events = append(events, outbox.New(Note{N: i}, outbox.WithKey(fmt.Sprintf("k%d", i%3))), outbox.New(Note{N: i}))
		}
		events = append(events, rejected)
		mustPublish(t, f, true, events...)
		b := NewBroker(nil)
		b.reject = func(m outbox.Message) error {
			if m.Type == rejected.Payload.EventType() {
				return errors.New("rejected by the broker: invalid message attribute")
			}
			if calls.Add(1)%2 == 0 {
				return outbox.Unavailable(errors.New("connection reset by peer"))
			}
			return nil
		}
		cfg := outageRelay("flaky")
		cfg.MaxAttempts = 3
		RunRelays(t, f.Store, b, 1, cfg, func() bool {
			return len(ids(b.Sent())) >= len(events)-1 && len(deadLetters(t, f)) == 1
		})
		dls := deadLetters(t, f)
		if len(dls) != 1 || dls[0].EventID != rejected.ID || dls[0].Attempts != 3 {
			t.Fatalf("dead letters = %+v, want only the rejected event, after 3 attempts", dls)
		}
		CheckPerKeyOrder(t, events, b.Sent())
	})
}
