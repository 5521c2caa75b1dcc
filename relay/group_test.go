package relay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
)

// concurrencySender counts the sends in flight, and the most at once, across every
// outbox it serves; each send takes a millisecond, as a broker's round trip.
type concurrencySender struct {
	now, most atomic.Int64
	mu        sync.Mutex
	sent      map[string]int // by outbox: the message's type
}

func (s *concurrencySender) Send(_ context.Context, msgs []outbox.Message) error {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for {
		m := s.most.Load()
		if n <= m || s.most.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(time.Millisecond)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.sent[m.Key]++
	}
	return nil
}

func (s *concurrencySender) count(outbox string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent[outbox]
}

// namedStore is a listStore of n messages keyed by the outbox's name (keys tell the
// sender which outbox a message came from).
func namedStore(name string, n int) *listStore {
	s := &listStore{}
	for i := range n {
		m, _ := outbox.New(testPayload{}, outbox.WithKey(name)).Encode()
		s.rows = append(s.rows, &listRow{seq: int64(i + 1), msg: m})
	}
	return s
}

func groupConfig() *relay.Config {
	return &relay.Config{
		BatchSize: 10, Concurrency: 4, MinPollInterval: time.Millisecond, MaxPollInterval: 5 * time.Millisecond,
		UnavailableBackoff: time.Millisecond, MaxUnavailableBackoff: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// TestGroupServesManyOutboxesWithinMaxCycles: ten outboxes of four loops each deliver
// everything while the group never runs more than MaxCycles sends at once; an outbox
// added while the group runs is served, one removed stops (its Run returned when Remove
// does) and leaves its rows alone; no goroutine outlives Run.
func TestGroupServesManyOutboxesWithinMaxCycles(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sender := &concurrencySender{sent: map[string]int{}}
	g, err := relay.NewGroup(&relay.GroupConfig{Name: "test", MaxCycles: 3, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const per = 200
	var tenant0 *listStore
	for i := range 10 {
		name := fmt.Sprintf("tenant-%d", i)
		s := namedStore(name, per)
		if i == 0 {
			tenant0 = s
		}
		if err := g.Add(relay.Outbox{Name: name, Store: s, Sender: sender, Config: groupConfig()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Add(relay.Outbox{Name: "tenant-0", Store: namedStore("x", 1), Sender: sender}); err == nil {
		t.Error("a second outbox named tenant-0 was added")
	}
	if err := g.Add(relay.Outbox{Name: "bad name", Store: namedStore("x", 1), Sender: sender}); err == nil {
		t.Error("an outbox named \"bad name\" was added")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Run(ctx) }()
	for i := range 10 {
		name := fmt.Sprintf("tenant-%d", i)
		outboxtest.WaitFor(t, 20*time.Second, name+" delivered", func() bool { return sender.count(name) == per })
	}
	if most := sender.most.Load(); most > 3 {
		t.Errorf("%d sends ran at once; MaxCycles is 3", most)
	}

	late := namedStore("late", per)
	if err := g.Add(relay.Outbox{Name: "late", Store: late, Sender: sender, Config: groupConfig()}); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 20*time.Second, "the outbox added while running delivered", func() bool { return sender.count("late") == per })
	if s, ok := g.State("late"); !ok || !s.Running || !s.Healthy() {
		t.Errorf("State(late) = %+v, %v; want running and healthy", s, ok)
	}

	if err := g.Remove(context.Background(), "late"); err != nil {
		t.Fatal(err)
	}
	if _, ok := g.State("late"); ok {
		t.Error("a removed outbox still has a state")
	}
	if err := g.Remove(context.Background(), "late"); !errors.Is(err, relay.ErrUnknownOutbox) {
		t.Errorf("removing it again: %v, want ErrUnknownOutbox", err)
	}
	// A removed relay claims nothing more: while another outbox's relay polls 20 times, the
	// removed one's store sees no claim.
	claims := func(s *listStore) int { _, _, _, limits, _ := s.snapshot(); return len(limits) }
	before, other := claims(late), claims(tenant0)
	outboxtest.WaitFor(t, 20*time.Second, "20 more polls of tenant-0", func() bool { return claims(tenant0) >= other+20 })
	if n := claims(late); n != before {
		t.Errorf("a removed outbox's relay went on claiming: %d claims after Remove", n-before)
	}
	if names := g.Names(); len(names) != 10 {
		t.Errorf("Names() = %v, want the 10 tenants", names)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for name, s := range g.States() {
		if s.Running {
			t.Errorf("%s still runs after Run returned", name)
		}
	}
}

// TestGroupOutboxFailsAlone: an outbox whose database is down (every claim fails) pauses
// alone and its State says so, and one whose schema is not migrated stops alone with the
// error in its State; the others deliver everything.
func TestGroupOutboxFailsAlone(t *testing.T) {
	sender := &concurrencySender{sent: map[string]int{}}
	var changes atomic.Int64
	g, err := relay.NewGroup(&relay.GroupConfig{MaxCycles: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnStateChange: func(_ context.Context, name string, s relay.State) {
			if name == "down" && !s.DatabaseUnavailableSince.IsZero() {
				changes.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	down := namedStore("down", 10)
	down.claimErr = errors.New("connection refused")
	unmigrated := namedStore("unmigrated", 10)
	unmigrated.validate = func() error { return fmt.Errorf("no table: %w", outbox.ErrSchema) }
	for name, s := range map[string]*listStore{"down": down, "unmigrated": unmigrated, "a": namedStore("a", 300), "b": namedStore("b", 300)} {
		if err := g.Add(relay.Outbox{Name: name, Store: s, Sender: sender, Config: groupConfig()}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	outboxtest.WaitFor(t, 20*time.Second, "a and b delivered", func() bool { return sender.count("a") == 300 && sender.count("b") == 300 })
	outboxtest.WaitFor(t, 20*time.Second, "unmigrated stopped", func() bool { s, _ := g.State("unmigrated"); return s.Stopped != nil })
	if s, _ := g.State("unmigrated"); !errors.Is(s.Stopped, outbox.ErrSchema) || s.Running || s.Healthy() {
		t.Errorf("State(unmigrated) = %+v, want stopped with ErrSchema", s)
	}
	s, _ := g.State("down")
	if s.DatabaseUnavailableSince.IsZero() || s.Healthy() || changes.Load() == 0 {
		t.Errorf("State(down) = %+v (%d changes reported); want its database unavailable", s, changes.Load())
	}
	if s, _ := g.State("a"); !s.Healthy() {
		t.Errorf("State(a) = %+v, want healthy", s)
	}
}
