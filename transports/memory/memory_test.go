package outboxmemory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

func TestConformance(t *testing.T) {
	for name, cfg := range map[string]*outboxmemory.Config{
		"standard": nil,
		"fifo":     {FIFO: true, DedupWindow: 5 * time.Minute, MaxMessageBytes: 1024},
	} {
		t.Run(name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				q := outboxmemory.New(cfg)
				return &outboxtest.TransportFixture{Sender: q, Receiver: q, Features: features(cfg),
					Outage: func(t *testing.T) *outboxtest.OutageFixture { return outage(cfg) }}
			})
		})
	}
}

// features are what a queue configured by cfg promises: FIFO and dedup as configured,
// batches and delays always.
func features(cfg *outboxmemory.Config) outboxtest.Features {
	c := cfg.WithDefaults()
	return outboxtest.Features{FIFO: c.FIFO, Dedup: c.DedupWindow > 0, Batch: true, Delay: true, MaxMessageBytes: c.MaxMessageBytes}
}

// outage is a queue whose SendHook refuses every message, and whose PingHook every ping,
// while the "broker" is down, as a broker that cannot be reached would: with an error
// marked outbox.Unavailable.
func outage(cfg *outboxmemory.Config) *outboxtest.OutageFixture {
	var down atomic.Bool
	c := outboxmemory.Config{}
	if cfg != nil {
		c = *cfg
	}
	refused := func() error {
		if down.Load() {
			return outbox.Unavailable(errors.New("connection refused"))
		}
		return nil
	}
	c.SendHook = func(outbox.Message) error { return refused() }
	c.PingHook = func(context.Context) error { return refused() }
	q := outboxmemory.New(&c)
	return &outboxtest.OutageFixture{
		Sender: q, Receiver: q, Features: features(cfg),
		Stop:  func(testing.TB) { down.Store(true) },
		Start: func(testing.TB) { down.Store(false) },
	}
}

// TestConfig: nil means the documented defaults, and New refuses a negative field.
func TestConfig(t *testing.T) {
	if d := (*outboxmemory.Config)(nil).WithDefaults(); d.VisibilityTimeout != 30*time.Second {
		t.Errorf("default VisibilityTimeout %v, want 30s", d.VisibilityTimeout)
	}
	defer func() {
		if r := fmt.Sprint(recover()); !strings.Contains(r, "DedupWindow -1s is negative") {
			t.Errorf("New with a negative DedupWindow: recovered %q, want a panic naming it", r)
		}
	}()
	outboxmemory.New(&outboxmemory.Config{DedupWindow: -time.Second})
}
