package outboxkafka_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox/outboxtest"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// TestConformance runs the transport suite against a three-broker kfake cluster, with a
// fresh six-partition topic and consumer group per subtest:
//   - "standard": the client's and broker's default limits;
//   - "topic-limit": a topic whose max.message.bytes (4 KiB) the sender reads from the
//     cluster, so an oversize record is refused before it is produced.
func TestConformance(t *testing.T) {
	c := newCluster(t)
	small := "4096"
	for _, v := range []struct {
		name    string
		configs map[string]*string
	}{
		{name: "standard"},
		{name: "topic-limit", configs: map[string]*string{"max.message.bytes": &small}},
	} {
		t.Run(v.name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				d := newDestination(t, c, v.configs)
				return &outboxtest.TransportFixture{
					Sender:   d.sender,
					Receiver: d.receiver,
					Features: outboxkafka.Features(context.Background(), d.sender, d.topic),
					SendRaw: func(ctx context.Context, body []byte) error {
						return d.client.ProduceSync(ctx, &kgo.Record{Topic: d.topic, Value: body}).FirstErr()
					},
				}
			})
		})
	}
}
