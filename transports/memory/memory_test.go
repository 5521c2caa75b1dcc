package outboxmemory_test

import (
	"context"
	"errors"
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
				return &outboxtest.TransportFixture{Sender: q, Receiver: q, Features: q.Features(),
					Outage: func(t *testing.T) *outboxtest.OutageFixture { return outage(cfg) }}
			})
		})
	}
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
		Sender: q, Receiver: q, Features: q.Features(),
		Stop:  func(testing.TB) { down.Store(true) },
		Start: func(testing.TB) { down.Store(false) },
	}
}
