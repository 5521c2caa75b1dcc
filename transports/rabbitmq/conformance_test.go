package outboxamqp_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox/outboxtest"
	outboxamqp "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestConformance runs the transport suite against RabbitMQ, with a fresh exchange and
// queue per subtest:
//   - "standard": a quorum queue, prefetch 100, retries through retry queues;
//   - "small-limit": a sender MaxMessageBytes of 4 KiB, caught before sending;
//   - "ordered": a single-active-consumer queue and an ordered receiver, which promise FIFO.
func TestConformance(t *testing.T) {
	admin(t, amqpURL()) // skip (or fail under CI) at once when the broker is down
	for _, v := range []struct {
		name string
		top  outboxamqp.Topology
		scfg outboxamqp.SenderConfig
	}{
		{name: "standard"},
		{name: "small-limit", scfg: outboxamqp.SenderConfig{MaxMessageBytes: 4096}},
		{name: "ordered", top: outboxamqp.Topology{Ordered: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				d := newDestination(t, v.top, v.scfg, outboxamqp.ReceiverConfig{})
				return &outboxtest.TransportFixture{
					Sender:   d.sender,
					Receiver: d.receiver,
					Features: outboxamqp.Features(d.sender, d.top),
					SendRaw: func(ctx context.Context, body []byte) error {
						return d.admin.PublishWithContext(ctx, d.top.Exchange, "raw", true, false, amqp.Publishing{Body: body})
					},
				}
			})
		})
	}
}
