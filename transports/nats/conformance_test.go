package outboxnats_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// TestConformance runs the transport suite against nats-server, with a fresh stream per
// subtest:
//   - "standard": 1000 messages in flight, the server's max payload as the limit;
//   - "stream-limit": a stream max_msg_size of 4 KiB that the sender is not told about, so
//     the server's refusal must come back as outbox.ErrTooLarge;
//   - "ordered": MaxAckPending 1, which promises FIFO.
func TestConformance(t *testing.T) {
	_, js := connect(t)
	for _, v := range []struct {
		name string
		top  outboxnats.Topology
	}{
		{name: "standard", top: outboxnats.Topology{Storage: jetstream.MemoryStorage}},
		{name: "stream-limit", top: outboxnats.Topology{Storage: jetstream.MemoryStorage, MaxMsgSize: 4096}},
		{name: "ordered", top: outboxnats.Topology{Storage: jetstream.MemoryStorage, Ordered: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				d := newDestination(t, js, v.top, outboxnats.SenderConfig{})
				return &outboxtest.TransportFixture{
					Sender:   d.sender,
					Receiver: d.receiver,
					Features: outboxnats.Features(d.sender, d.stream.CachedInfo().Config, d.consumer.CachedInfo().Config),
					SendRaw: func(ctx context.Context, body []byte) error {
						_, err := js.Publish(ctx, d.prefix+".raw", body)
						return err
					},
				}
			})
		})
	}
}
