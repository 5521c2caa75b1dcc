package outboxrabbitmq_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestConformance runs the transport suite against RabbitMQ, with a fresh exchange and
// queue per subtest:
//   - "standard": a quorum queue, prefetch 100, retries through retry queues;
//   - "small-limit": a sender MaxMessageBytes of 4 KiB, caught before sending;
//   - "ordered": a single-active-consumer queue and an ordered receiver, which promise FIFO.
func TestConformance(t *testing.T) {
	admin(t, outboxtest.AMQPURL()) // skip (or fail under CI) at once when the broker is down
	for _, v := range []struct {
		name   string
		top    outboxrabbitmq.Topology
		scfg   outboxrabbitmq.SenderConfig
		outage bool // the Outage subtests run on a private RabbitMQ node
	}{
		{name: "standard", outage: true},
		{name: "small-limit", scfg: outboxrabbitmq.SenderConfig{MaxMessageBytes: 4096}},
		{name: "ordered", top: outboxrabbitmq.Topology{Ordered: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				d := newDestination(t, v.top, v.scfg, outboxrabbitmq.ReceiverConfig{})
				var outage func(t *testing.T) *outboxtest.OutageFixture
				if v.outage {
					outage = func(t *testing.T) *outboxtest.OutageFixture { return rabbitOutage(t, v.top, v.scfg) }
				}
				return &outboxtest.TransportFixture{
					Outage:   outage,
					Sender:   d.sender,
					Receiver: d.receiver,
					Features: d.features(),
					SendRaw: func(ctx context.Context, body []byte) error {
						return d.admin.PublishWithContext(ctx, d.top.Exchange, "raw", true, false, amqp.Publishing{Body: body})
					},
					// A producer or bridge that writes another binding's headers as they
					// are, the content type in its AMQP property.
					SendForeign: func(ctx context.Context, m outboxtest.ForeignMessage) error {
						p := amqp.Publishing{Headers: amqp.Table{}, Body: m.Body}
						for k, v := range m.Headers {
							if strings.EqualFold(k, "content-type") {
								p.ContentType = v
							} else {
								p.Headers[k] = v
							}
						}
						return d.admin.PublishWithContext(ctx, d.top.Exchange, "foreign", true, false, p)
					},
					ReceiveForeign: func(ctx context.Context) (outboxtest.ForeignMessage, error) {
						return receiveForeign(ctx, d.admin, d.top.Queue)
					},
				}
			})
		})
	}
}

// receiveForeign takes the next message off queue with amqp091-go alone, and acks it: the
// AMQP binding's "cloudEvents_" headers become "ce-" ones, the content-type property
// "content-type", as a CloudEvents reader maps them.
func receiveForeign(ctx context.Context, ch *amqp.Channel, queue string) (outboxtest.ForeignMessage, error) {
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return outboxtest.ForeignMessage{}, err
		}
		if !ok {
			select {
			case <-ctx.Done():
				return outboxtest.ForeignMessage{}, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		m := outboxtest.ForeignMessage{Headers: map[string]string{}, Body: d.Body}
		for k, v := range d.Headers {
			if name, ok := strings.CutPrefix(k, outboxrabbitmq.PropertyPrefix); ok {
				k = "ce-" + name
			}
			m.Headers[k] = fmt.Sprint(v)
		}
		if d.ContentType != "" {
			m.Headers["content-type"] = d.ContentType
		}
		return m, d.Ack(false)
	}
}

// rabbitOutage is a destination on a private RabbitMQ node, which the suite SIGKILLs and
// starts again on the same ports and data directory (durable queues and persistent
// messages survive it).
func rabbitOutage(t *testing.T, top outboxrabbitmq.Topology, scfg outboxrabbitmq.SenderConfig) *outboxtest.OutageFixture {
	node := startRabbitMQ(t)
	d := newDestinationAt(t, node.url(), top, scfg, outboxrabbitmq.ReceiverConfig{MaxWait: 500 * time.Millisecond})
	return &outboxtest.OutageFixture{
		Sender:   d.sender,
		Receiver: d.receiver,
		Features: d.features(),
		Stop:     func(testing.TB) { node.Kill() },
		Start:    func(testing.TB) { node.Start() },
		Pipeline: func(t *testing.T) *outboxtest.PipelineFixture {
			return pgxtest.New(t, "outboxrabbitmq").Pipeline(t, d.sender, d.receiver)
		},
	}
}
