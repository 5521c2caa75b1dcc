package outboxnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

func TestMain(m *testing.M) {
	if os.Getenv(childConsumerEnv) != "" {
		runChildConsumer() // TestConsumerKilledBetweenCommitAndAck re-runs this binary as its consumer
	}
	goleak.VerifyTestMain(m)
}

// connect opens a NATS connection with JetStream for the test, closed at its end.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(outboxtest.NATSURL(), nats.Timeout(2*time.Second), nats.Name(t.Name()))
	if err != nil {
		outboxtest.RequireService(t, "NATS at "+outboxtest.Shown(outboxtest.NATSURL()), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		outboxtest.RequireService(t, "JetStream at "+outboxtest.Shown(outboxtest.NATSURL()), err)
	}
	return nc, js
}

// unique returns a fresh lower-case suffix for stream, subject and schema names.
func unique() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// provision creates t (a fresh, uniquely named stream and consumer), deleted at cleanup.
func provision(t testing.TB, js jetstream.JetStream, top outboxnats.Topology) (jetstream.Stream, jetstream.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, consumer, err := outboxnats.Provision(ctx, js, top)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, top.Stream); err != nil {
			t.Errorf("deleting stream %s: %v", top.Stream, err)
		}
	})
	return stream, consumer
}

// destination is a fresh stream, consumer, sender and receiver for one test.
type destination struct {
	prefix   string
	stream   jetstream.Stream
	consumer jetstream.Consumer
	sender   *outboxnats.Sender
	receiver *outboxnats.Receiver
}

func newDestination(t testing.TB, js jetstream.JetStream, top outboxnats.Topology, cfg outboxnats.SenderConfig) *destination {
	t.Helper()
	id := unique()
	d := &destination{prefix: "outboxtest." + id}
	top.Stream = "OUTBOXTEST_" + id
	top.Subjects = []string{d.prefix + ".>"}
	d.stream, d.consumer = provision(t, js, top)
	cfg.SubjectPrefix = d.prefix
	cfg.Stream = top.Stream
	var err error
	if d.sender, err = outboxnats.NewSender(js, &cfg); err != nil {
		t.Fatal(err)
	}
	if d.receiver, err = outboxnats.NewReceiver(d.consumer, nil); err != nil {
		t.Fatal(err)
	}
	return d
}

// features are what d's sender and receiver promise together, from the stream's and the
// consumer's configuration:
//
//   - FIFO only when the consumer has MaxAckPending 1 and explicit acks: JetStream keeps
//     publish order in the stream, but a consumer with several messages in flight lets
//     later messages overtake one that is being retried (TestStandardConsumerIsNotFIFO).
//   - Dedup when the stream has a Duplicates window (the server's default is 2 minutes).
//   - Batch and Delay always (async publish; nak with delay).
//   - MaxMessageBytes: the sender's limit, lowered to the stream's MaxMsgSize if set.
func (d *destination) features() outboxtest.Features {
	stream, consumer := d.stream.CachedInfo().Config, d.consumer.CachedInfo().Config
	limit := d.sender.MaxMessageBytes()
	if stream.MaxMsgSize > 0 && (limit == 0 || int(stream.MaxMsgSize) < limit) {
		limit = int(stream.MaxMsgSize)
	}
	return outboxtest.Features{
		FIFO:            consumer.MaxAckPending == 1 && consumer.AckPolicy == jetstream.AckExplicitPolicy,
		Dedup:           stream.Duplicates > 0,
		Batch:           true,
		Delay:           true,
		MaxMessageBytes: limit,
	}
}

// streamMsgs returns how many messages the stream stores now.
func streamMsgs(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}
