package outboxmem_test

import (
	"testing"
	"time"

	"github.com/txoutbox/outbox/outboxtest"
	outboxmem "github.com/txoutbox/outbox/transports/memory"
)

func TestConformance(t *testing.T) {
	for name, cfg := range map[string]*outboxmem.Config{
		"standard": nil,
		"fifo":     {FIFO: true, DedupWindow: 5 * time.Minute, MaxMessageBytes: 1024},
	} {
		t.Run(name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				q := outboxmem.New(cfg)
				return &outboxtest.TransportFixture{Sender: q, Receiver: q, Features: q.Features()}
			})
		})
	}
}
