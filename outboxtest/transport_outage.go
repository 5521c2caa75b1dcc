package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
)

// OutageFixture is a destination on a broker that the Outage subtests of
// [ExerciseTransport] may stop and start again: a private broker process or in-process
// cluster of the test's own, never a shared one.
type OutageFixture struct {
	// Sender and Receiver reach the broker that Stop and Start control, and reconnect by
	// themselves once it is back.
	Sender   outbox.Sender
	Receiver outbox.Receiver
	// Features are the Sender's: MaxMessageBytes (0: none) for a per-message fault, FIFO to
	// check per-key order through the outage.
	Features Features
	// Stop makes the broker unavailable and returns once it is (a process killed, a
	// cluster closed, a hook that refuses every send).
	Stop func(t testing.TB)
	// Start brings the broker back and returns once it accepts connections, with the
	// destination the Sender and Receiver use (an emulator that keeps nothing across a
	// restart must have its queue created again).
	Start func(t testing.TB)
	// Pipeline, when set, returns an outbox in front of Sender and Receiver (pgxtest's
	// Outbox.Pipeline does it): the suite then runs a relay through an outage ten times
	// longer than their retry horizon.
	Pipeline func(t *testing.T) *PipelineFixture
	// SendTimeout bounds each Send, as relay.Config.SendTimeout does for the relay: while the
	// broker is down a Send must fail within it. Default 10s.
	SendTimeout time.Duration
	// Timeout bounds each wait for the broker to take messages again and for messages to
	// arrive. Default 60s.
	Timeout time.Duration
}

// exerciseTransportOutage runs the Outage subtests on one broker, one after the other: the broker is
// the test's own, and each subtest stops and starts it.
func exerciseTransportOutage(t *testing.T, o *OutageFixture) {
	if o.SendTimeout == 0 {
		o.SendTimeout = 10 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	t.Run("SendFailsAsUnavailable", func(t *testing.T) { sendFailsAsUnavailable(t, o) })
	t.Run("PingFailsAsUnavailable", func(t *testing.T) {
		p, ok := o.Sender.(outbox.Pinger)
		if !ok {
			t.Skip("the Sender is not an outbox.Pinger")
		}
		pingFailsAsUnavailable(t, o, p)
	})
	t.Run("RelayWaitsOutTheOutage", func(t *testing.T) {
		if o.Pipeline == nil {
			t.Skip("fixture has no Pipeline")
		}
		relayWaitsOutTheOutage(t, o)
	})
	t.Run("IdleRelayPingsTheBrokerBack", func(t *testing.T) {
		switch _, ok := o.Sender.(outbox.Pinger); {
		case o.Pipeline == nil:
			t.Skip("fixture has no Pipeline")
		case !ok:
			t.Skip("the Sender is not an outbox.Pinger")
		}
		idleRelayPingsTheBrokerBack(t, o)
	})
}

// outageSwitch stops and starts o's broker, and starts it again when the test ends early.
type outageSwitch struct {
	o    *OutageFixture
	down bool
}

func newOutageSwitch(t testing.TB, o *OutageFixture) *outageSwitch {
	s := &outageSwitch{o: o}
	t.Cleanup(func() {
		if s.down {
			s.start(t)
		}
	})
	return s
}

func (s *outageSwitch) stop(t testing.TB) {
	t.Helper()
	s.down = true
	s.o.Stop(t)
}

func (s *outageSwitch) start(t testing.TB) {
	t.Helper()
	s.o.Start(t)
	s.down = false
}

// sendFailsAsUnavailable: a Send while the broker is down fails for every message with an
// error marked outbox.Unavailable, and so does every failed Send until the broker takes
// messages again; after the restart the same batch goes through; a message over the size
// limit stays its own fault.
func sendFailsAsUnavailable(t *testing.T, o *OutageFixture) {
	sw := newOutageSwitch(t, o)
	send := func(msgs []outbox.Message) error {
		ctx, cancel := context.WithTimeout(context.Background(), o.SendTimeout)
		defer cancel()
		return o.Sender.Send(ctx, msgs)
	}
	warm := []outbox.Message{testMessage("acct-1", `{"n":1}`), testMessage("", `{"n":2}`)}
	if err := send(warm); err != nil {
		t.Fatalf("Send before the outage: %v", err)
	}
	recv := startCollecting(t, o.Receiver)
	recv.await(t, o.Timeout, "the messages sent before the outage", warm...)

	sw.stop(t)
	batch := []outbox.Message{testMessage("acct-1", `{"n":3}`), testMessage("acct-2", `{"n":4}`), testMessage("", `{"n":5}`)}
	for try := range 2 { // the relay's first send, then a probe
		if err := allUnavailable(send(batch), len(batch)); err != nil {
			t.Fatalf("Send %d while the broker is down: %v", try+1, err)
		}
	}

	sw.start(t)
	failures := 0
	var last error
	WaitFor(t, o.Timeout, "a Send to succeed after the broker restarted", func() bool {
		err := send(batch) // the relay sends the same messages again
		if err == nil {
			return true
		}
		if err := failedUnavailable(err); err != nil { // some messages may go through already
			t.Fatalf("Send while the broker comes back, failure %d: %v", failures+1, err)
		}
		failures++
		last = err
		return false
	})
	if failures > 0 {
		t.Logf("%d Send(s) failed as unavailable while the broker came back (the last: %v)", failures, last)
	}
	recv.await(t, o.Timeout, "the batch sent after the restart", batch...)

	if o.Features.MaxMessageBytes == 0 {
		return
	}
	big := testMessage("acct-1", "")
	big.ContentType = "application/octet-stream"
	big.Body = bytes.Repeat([]byte{'x'}, o.Features.MaxMessageBytes+1)
	ok := testMessage("acct-2", `{"n":6}`)
	err := send([]outbox.Message{big, ok})
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[0] == nil {
		t.Fatalf("Send of an oversize message and a valid one = %v, want a BatchError failing only the first", err)
	}
	if e := be.Failed[0]; outbox.IsUnavailable(e) || !errors.Is(e, outbox.ErrTooLarge) {
		t.Fatalf("oversize message: %v (unavailable %v), want its own fault wrapping outbox.ErrTooLarge", e, outbox.IsUnavailable(e))
	}
	recv.await(t, o.Timeout, "the valid message sent with the oversize one", ok)
}

// pingFailsAsUnavailable: Ping answers nil while the broker is up; while it is down it
// fails within the send's deadline with an error marked outbox.Unavailable; after the
// restart it answers nil again, every failure on the way back marked unavailable too.
func pingFailsAsUnavailable(t *testing.T, o *OutageFixture, p outbox.Pinger) {
	sw := newOutageSwitch(t, o)
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), o.SendTimeout)
		defer cancel()
		return p.Ping(ctx)
	}
	if err := ping(); err != nil {
		t.Fatalf("Ping before the outage: %v", err)
	}
	sw.stop(t)
	for try := range 2 { // the relay pings again after its backoff
		err := ping()
		if err == nil || !outbox.IsUnavailable(err) {
			t.Fatalf("Ping %d while the broker is down = %v, want an error marked outbox.Unavailable", try+1, err)
		}
		if try == 0 {
			t.Logf("Ping while the broker is down: %v", err)
		}
	}
	sw.start(t)
	failures := 0
	WaitFor(t, o.Timeout, "Ping to succeed after the broker restarted", func() bool {
		err := ping()
		if err != nil && !outbox.IsUnavailable(err) {
			t.Fatalf("Ping while the broker comes back, failure %d: %v (not marked outbox.Unavailable)", failures+1, err)
		}
		if err != nil {
			failures++
		}
		return err == nil
	})
	if failures > 0 {
		t.Logf("%d Ping(s) failed as unavailable while the broker came back", failures)
	}
}

// idleRelayPingsTheBrokerBack: of two relays on one outbox that both found the broker
// down, the one that drains the outbox once it is back learns so by sending; the other,
// which finds nothing left to send, learns it by pinging ([outbox.Pinger]) and reports the
// broker available again (Relay.State) without a message to send. Here the second relay's
// sends and pings are held back until the first has drained everything, so it cannot
// learn it any other way.
func idleRelayPingsTheBrokerBack(t *testing.T, o *OutageFixture) {
	sw := newOutageSwitch(t, o)
	p := o.Pipeline(t)
	ctx := context.Background()
	held := &heldSender{Sender: p.Sender}
	drainer := runOutageRelay(t, p, p.Sender, relay.Config{Name: "drainer"})
	idle := runOutageRelay(t, p, held, relay.Config{Name: "idle"})
	recv := startCollecting(t, p.Receiver)
	publish := func(from, n int) []outbox.Message {
		t.Helper()
		var events []outbox.Encodable
		var msgs []outbox.Message
		for i := from; i < from+n; i++ {
			e := outbox.New(Note{Text: fmt.Sprintf("event %d", i)})
			m, _ := e.Encode()
			events, msgs = append(events, e), append(msgs, m)
		}
		if err := p.Publish(ctx, events...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		drainer.Wake()
		idle.Wake()
		return msgs
	}
	recv.await(t, o.Timeout, "the events published before the outage", publish(0, 4)...)

	sw.stop(t)
	during := publish(4, 12)
	WaitFor(t, o.Timeout, "both relays to report the broker unavailable", func() bool {
		return !drainer.State().BrokerUnavailableSince.IsZero() && !idle.State().BrokerUnavailableSince.IsZero()
	})
	held.hold.Store(true)
	sw.start(t)
	restartedAt := time.Now()
	recv.await(t, o.Timeout, "the events the draining relay sends after the restart", during...)
	WaitFor(t, o.Timeout, "the draining relay to report the broker available", func() bool {
		return drainer.State().BrokerUnavailableSince.IsZero()
	})
	drained := time.Since(restartedAt)
	if s := idle.State(); s.BrokerUnavailableSince.IsZero() {
		t.Fatalf("the relay whose sends were held back reports the broker available (%+v)", s)
	}
	held.sent.Store(0)
	held.hold.Store(false) // it may reach the broker now, with nothing left to send
	letThrough := time.Now()
	WaitFor(t, o.Timeout, "the idle relay to report the broker available again (by Ping)", func() bool {
		s := idle.State()
		return s.BrokerUnavailableSince.IsZero() && s.BrokerErr == nil
	})
	t.Logf("after the restart, the draining relay sent everything and reported the broker available in %v; the idle relay reported it available %v after it could reach it",
		drained.Round(time.Millisecond), time.Since(letThrough).Round(time.Millisecond))
	if n := held.sent.Load(); n > 0 {
		t.Errorf("the idle relay sent %d message(s) after its sends were let through; the outbox was drained", n)
	}
	expectNoDeadLetters(t, p.DeadLetters, "after the outage")
}

// runOutageRelay runs a relay of p's outbox through s until the test ends, with cfg's name
// and retries and the outage subtests' timings: probes every 50–500ms, 2s per send, polls
// every 10–50ms.
func runOutageRelay(t testing.TB, p *PipelineFixture, s outbox.Sender, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.UnavailableBackoff, cfg.MaxUnavailableBackoff = 50*time.Millisecond, 500*time.Millisecond
	cfg.Lease, cfg.SendTimeout = 6*time.Second, 2*time.Second
	cfg.MinPollInterval, cfg.MaxPollInterval = 10*time.Millisecond, 50*time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	relay, err := relay.New(p.Store, s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Relay.Run (%s): %v", cfg.Name, err)
		}
	})
	return relay
}

// heldSender passes sends and pings to Sender (an outbox.Pinger), or, while hold is set,
// fails them as unavailable: a relay that cannot reach the broker while another can.
type heldSender struct {
	outbox.Sender
	hold atomic.Bool
	sent atomic.Int64 // messages passed to Sender
}

func (h *heldSender) Send(ctx context.Context, msgs []outbox.Message) error {
	if h.hold.Load() {
		return outbox.Unavailable(errors.New("outboxtest: this relay's sends are held back"))
	}
	err := h.Sender.Send(ctx, msgs)
	h.sent.Add(int64(len(msgs)))
	return err
}

func (h *heldSender) Ping(ctx context.Context) error {
	if h.hold.Load() {
		return outbox.Unavailable(errors.New("outboxtest: this relay's pings are held back"))
	}
	return h.Sender.(outbox.Pinger).Ping(ctx)
}

// allUnavailable checks that err fails all n messages of a Send, each marked unavailable:
// one error for the whole Send, or an *outbox.BatchError naming every message.
func allUnavailable(err error, n int) error {
	if err == nil {
		return errors.New("succeeded, want every message to fail as unavailable")
	}
	var be *outbox.BatchError
	if !errors.As(err, &be) {
		if !outbox.IsUnavailable(err) {
			return fmt.Errorf("failed whole with an error not marked unavailable (outbox.IsUnavailable false): %w", err)
		}
		return nil
	}
	var errs []error
	for i := range n {
		e, failed := be.Failed[i]
		switch {
		case !failed:
			errs = append(errs, fmt.Errorf("message %d did not fail", i))
		case !outbox.IsUnavailable(e):
			errs = append(errs, fmt.Errorf("message %d failed with an error not marked unavailable: %w", i, e))
		}
	}
	return errors.Join(errs...)
}

// failedUnavailable checks that every failure err reports is marked unavailable.
func failedUnavailable(err error) error {
	var be *outbox.BatchError
	if !errors.As(err, &be) {
		return allUnavailable(err, 0)
	}
	var errs []error
	for i, e := range be.Failed {
		if !outbox.IsUnavailable(e) {
			errs = append(errs, fmt.Errorf("message %d failed with an error not marked unavailable: %w", i, e))
		}
	}
	return errors.Join(errs...)
}

// relayWaitsOutTheOutage: a relay whose retry horizon (MaxAttempts × RetryBackoff) is
// 600ms keeps events, keyed and keyless, through an outage ten times as long: none is
// dead-lettered, Relay.State says since when the broker is unavailable, and after the
// restart every event is delivered (in order per key on a FIFO transport) and the state
// clears.
func relayWaitsOutTheOutage(t *testing.T, o *OutageFixture) {
	const (
		maxAttempts = 3
		backoff     = 200 * time.Millisecond
		horizon     = maxAttempts * backoff
		outage      = 10 * horizon
	)
	sw := newOutageSwitch(t, o)
	p := o.Pipeline(t)
	ctx := context.Background()
	relay := runOutageRelay(t, p, p.Sender, relay.Config{
		Name: "outage", MaxAttempts: maxAttempts, RetryBackoff: backoff, MaxRetryBackoff: backoff,
	})
	recv := startCollecting(t, p.Receiver)

	var published []outbox.Encodable
	publish := func(from, n int) []outbox.Message {
		t.Helper()
		var events []outbox.Encodable
		var msgs []outbox.Message
		for i := from; i < from+n; i++ {
			var opts []outbox.Option
			if i%3 != 0 {
				opts = append(opts, outbox.WithKey(fmt.Sprintf("acct-%d", i%4)))
			}
			e := outbox.New(Note{Text: fmt.Sprintf("event %d", i)}, opts...)
			events = append(events, e)
			m, _ := e.Encode()
			msgs = append(msgs, m)
		}
		if err := p.Publish(ctx, events...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		published = append(published, events...)
		relay.Wake()
		return msgs
	}
	before := publish(0, 12)
	recv.await(t, o.Timeout, "the events published before the outage", before...)

	sw.stop(t)
	stoppedAt := time.Now()
	during := publish(12, 12)
	WaitFor(t, o.Timeout, "Relay.State to report the broker unavailable", func() bool {
		return !relay.State().BrokerUnavailableSince.IsZero()
	})
	during = append(during, publish(24, 12)...)
	// The outage lasts this long, whatever happens meanwhile: ten times the horizon over
	// which a failure counted against each message would have dead-lettered it.
	time.Sleep(time.Until(stoppedAt.Add(outage)))
	if s := relay.State(); s.BrokerUnavailableSince.Before(stoppedAt) || s.BrokerErr == nil || !outbox.IsUnavailable(s.BrokerErr) {
		t.Errorf("relay state %+v after %v of outage, want the broker unavailable since the outage began", s, time.Since(stoppedAt).Round(time.Millisecond))
	}
	expectNoDeadLetters(t, p.DeadLetters, "during the outage")

	sw.start(t)
	restartedAt := time.Now()
	recv.await(t, o.Timeout, "every event published during the outage", during...)
	t.Logf("broker down %v (%d× the retry horizon of %v); the events came through %v after the restart",
		restartedAt.Sub(stoppedAt).Round(time.Millisecond), outage/horizon, horizon, time.Since(restartedAt).Round(time.Millisecond))
	WaitFor(t, o.Timeout, "Relay.State to report the broker available again", func() bool {
		s := relay.State()
		return s.Running && s.BrokerUnavailableSince.IsZero() && s.BrokerErr == nil
	})
	expectNoDeadLetters(t, p.DeadLetters, "after the outage")
	if o.Features.FIFO {
		CheckPerKeyOrder(t, published, recv.messages())
	}
}

func expectNoDeadLetters(t testing.TB, dl deadletter.Table, when string) {
	t.Helper()
	entries, err := dl.List(context.Background(), deadletter.Filter{})
	if err != nil {
		t.Fatalf("listing dead letters: %v", err)
	}
	for _, e := range entries {
		t.Errorf("dead letter %s: %s", when, e.Reason)
	}
}

// collector receives from a Receiver in the background, acking each delivery, for tests in
// which the broker goes away: a failed Receive is tried again (a receiver reconnects), not
// fatal.
type collector struct {
	mu   sync.Mutex
	seen map[uuid.UUID]int
	msgs []outbox.Message // in order of arrival, copies included
	errs int
	last error
}

// startCollecting receives from r until the test ends.
func startCollecting(t testing.TB, r outbox.Receiver) *collector {
	c := &collector{seen: map[uuid.UUID]int{}}
	// Stopping lets the Receive in flight end by its own deadline rather than cancelling
	// it: a cancelled long poll may leave messages the broker handed it invisible until
	// their visibility timeout (SQS) or AckWait (NATS), which the next subtest, on the
	// same destination, would wait out.
	stop, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	go func() {
		defer close(done)
		for !stopped() {
			rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
			ds, err := r.Receive(rctx, 100)
			rcancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				c.mu.Lock()
				c.errs, c.last = c.errs+1, err
				c.mu.Unlock()
				select { // a receiver that fails at once would spin
				case <-stop:
				case <-time.After(50 * time.Millisecond):
				}
			}
			for _, d := range ds {
				m, err := d.Message()
				actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = d.Ack(actx) // a lost ack is a copy later, which the collector counts
				acancel()
				if err != nil {
					continue
				}
				c.mu.Lock()
				c.seen[m.ID]++
				c.msgs = append(c.msgs, m)
				c.mu.Unlock()
			}
		}
	}()
	return c
}

// await waits until every one of want has arrived at least once.
func (c *collector) await(t testing.TB, timeout time.Duration, what string, want ...outbox.Message) {
	t.Helper()
	missing := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		n := 0
		for _, m := range want {
			if c.seen[m.ID] == 0 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(timeout)
	for n := missing(); n > 0; n = missing() {
		if time.Now().After(deadline) {
			c.mu.Lock()
			errs, last := c.errs, c.last
			c.mu.Unlock()
			t.Fatalf("timed out after %v waiting for %s: %d of %d missing (%d failed receives, the last: %v)",
				timeout, what, n, len(want), errs, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *collector) messages() []outbox.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]outbox.Message(nil), c.msgs...)
}
