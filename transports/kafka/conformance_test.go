package outboxkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
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
		outage  bool // the Outage subtests run on a cluster of their own
	}{
		{name: "standard", outage: true},
		{name: "topic-limit", configs: map[string]*string{"max.message.bytes": &small}},
	} {
		t.Run(v.name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				d := newDestination(t, c, v.configs)
				var outage func(t *testing.T) *outboxtest.OutageFixture
				if v.outage {
					outage = kafkaOutage
				}
				return &outboxtest.TransportFixture{
					Outage:   outage,
					Sender:   d.sender,
					Receiver: d.receiver,
					Features: features(d.sender, d.topic),
					SendRaw: func(ctx context.Context, body []byte) error {
						return d.client.ProduceSync(ctx, &kgo.Record{Topic: d.topic, Value: body}).FirstErr()
					},
					SendForeign: func(ctx context.Context, m outboxtest.ForeignMessage) error {
						r := &kgo.Record{Topic: d.topic, Value: m.Body}
						for k, v := range m.Headers {
							r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
						}
						return d.client.ProduceSync(ctx, r).FirstErr()
					},
					ReceiveForeign: func(ctx context.Context) (outboxtest.ForeignMessage, error) {
						return receiveForeign(ctx, c, d.topic)
					},
				}
			})
		})
	}
}

// receiveForeign reads the first record of topic with a plain franz-go consumer, as a
// consumer without txoutbox does (Kafka keeps it: the suite reads one message per topic).
func receiveForeign(ctx context.Context, c *kfake.Cluster, topic string) (outboxtest.ForeignMessage, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Second))
	if err != nil {
		return outboxtest.ForeignMessage{}, err
	}
	defer cl.Close()
	for {
		fs := cl.PollRecords(ctx, 1)
		if err := ctx.Err(); err != nil {
			return outboxtest.ForeignMessage{}, err
		}
		for _, r := range fs.Records() {
			m := outboxtest.ForeignMessage{Headers: map[string]string{}, Body: r.Value}
			for _, h := range r.Headers {
				m.Headers[h.Key] = string(h.Value)
			}
			return m, nil
		}
	}
}

// kafkaOutage is a destination on a kfake cluster of its own, which the suite closes and
// starts again on the same ports from its data directory.
func kafkaOutage(t *testing.T) *outboxtest.OutageFixture {
	rc := newRestartableCluster(t)
	client := newClientAddrs(t, rc.addrs())
	topic := createTopic(t, client, nil)
	sender, err := outboxkafka.NewSender(client, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	receiver, err := outboxkafka.NewReceiver(&outboxkafka.ReceiverConfig{Group: "outage-" + topic, Topics: []string{topic},
		MaxWait: 200 * time.Millisecond, Logger: quiet()}, seeds(rc.addrs())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = receiver.Close() })
	return &outboxtest.OutageFixture{
		Sender:   sender,
		Receiver: receiver,
		Features: features(sender, topic),
		Stop:     func(testing.TB) { rc.kill() },
		Start:    func(testing.TB) { rc.start() },
		Pipeline: func(t *testing.T) *outboxtest.PipelineFixture {
			return pgxtest.New(t, "outboxkafka").Pipeline(t, sender, receiver)
		},
		// A produce to a cluster that is gone waits for its context: franz-go retries it.
		SendTimeout: 3 * time.Second,
	}
}

// features are what the transport promises for records s produces to topic and a Receiver
// reads: per-key order (a key's records share a partition, and the receiver holds a key's
// later records while an earlier one is retried), batches, delayed redelivery, and s's size
// limit for topic. Kafka does not deduplicate by event ID.
func features(s *outboxkafka.Sender, topic string) outboxtest.Features {
	limit, _ := s.MaxMessageBytes(context.Background(), topic)
	return outboxtest.Features{FIFO: true, Batch: true, Delay: true, MaxMessageBytes: limit}
}
