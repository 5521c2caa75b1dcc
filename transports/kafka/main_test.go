package outboxkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Test clusters have three brokers and topics six partitions: keys spread over partitions
// led by different brokers.
const (
	brokers    = 3
	partitions = 6
)

// newCluster starts an in-process Kafka cluster (franz-go's kfake), closed when t ends.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(brokers)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// unique returns a fresh suffix for topic and group names.
func unique() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newClient returns a client of c, closed when t ends; producers linger 0 (the relay's
// batches are batches already).
func newClient(t testing.TB, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return newClientAddrs(t, c.ListenAddrs(), opts...)
}

func newClientAddrs(t testing.TB, addrs []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(seeds(addrs), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// seeds are the options of every test client: the cluster's addresses, and no linger.
func seeds(addrs []string) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ProducerLinger(0)}
}

// createTopic creates a fresh topic with the test partition count and the given configs.
func createTopic(t testing.TB, cl *kgo.Client, configs map[string]*string) string {
	t.Helper()
	return createTopicN(t, cl, partitions, configs)
}

// createTopicN creates a fresh topic with n partitions.
func createTopicN(t testing.TB, cl *kgo.Client, n int32, configs map[string]*string) string {
	t.Helper()
	topic := "outboxtest." + unique()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, n, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	return topic
}

// newReceiver joins a fresh group (or the one given) on topic, closed when t ends.
func newReceiver(t testing.TB, c *kfake.Cluster, cfg outboxkafka.ReceiverConfig) *outboxkafka.Receiver {
	t.Helper()
	if cfg.Group == "" {
		cfg.Group = "group." + unique()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r, err := outboxkafka.NewReceiver(&cfg, kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// destination is a fresh topic with a sender and a receiver in a fresh group.
type destination struct {
	topic    string
	client   *kgo.Client
	sender   *outboxkafka.Sender
	receiver *outboxkafka.Receiver
}

func newDestination(t testing.TB, c *kfake.Cluster, topicConfigs map[string]*string) *destination {
	t.Helper()
	d := &destination{client: newClient(t, c)}
	d.topic = createTopic(t, d.client, topicConfigs)
	var err error
	if d.sender, err = outboxkafka.NewSender(d.client, &outboxkafka.SenderConfig{Topic: d.topic}); err != nil {
		t.Fatal(err)
	}
	d.receiver = newReceiver(t, c, outboxkafka.ReceiverConfig{Topics: []string{d.topic}, MaxWait: time.Second})
	return d
}
