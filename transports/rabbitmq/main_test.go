package outboxrabbitmq_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// admin opens a plain connection and channel for declaring and inspecting, closed at the
// test's end; a broker that cannot be reached is outboxtest.RequireService's business.
func admin(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		outboxtest.RequireService(t, "RabbitMQ at "+outboxrabbitmq.Where(url), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// unique returns a fresh lower-case suffix for exchange, queue and schema names.
func unique() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testDelays are short retry queues, so retries in tests take a second, not minutes.
var testDelays = []time.Duration{200 * time.Millisecond, time.Second, 2 * time.Second}

// destination is a fresh exchange and queue (with retry queues), a sender and a receiver
// features are what d's sender and receiver promise together:
//
//   - FIFO when the topology is Ordered: single active consumer, one message in flight,
//     and Nack holding a message in place (the receiver sets ReceiverConfig.Ordered too).
//   - Dedup never: RabbitMQ does not deduplicate by message-id.
//   - Batch and Delay always (confirms are awaited per batch; retry queues delay).
//   - MaxMessageBytes: the sender's MaxMessageBytes.
func (d *destination) features() outboxtest.Features {
	return outboxtest.Features{FIFO: d.top.Ordered, Batch: true, Delay: true, MaxMessageBytes: d.sender.MaxMessageBytes()}
}

// for one test; everything is deleted and closed at its end.
type destination struct {
	top      outboxrabbitmq.Topology
	admin    *amqp.Channel
	sender   *outboxrabbitmq.Sender
	receiver *outboxrabbitmq.Receiver
	conn     outboxrabbitmq.Connection
}

func newDestination(t testing.TB, top outboxrabbitmq.Topology, scfg outboxrabbitmq.SenderConfig, rcfg outboxrabbitmq.ReceiverConfig) *destination {
	t.Helper()
	return newDestinationAt(t, outboxtest.AMQPURL(), top, scfg, rcfg)
}

func newDestinationAt(t testing.TB, url string, top outboxrabbitmq.Topology, scfg outboxrabbitmq.SenderConfig, rcfg outboxrabbitmq.ReceiverConfig) *destination {
	t.Helper()
	ch := admin(t, url)
	id := unique()
	top.Exchange = "outboxtest." + id
	top.Queue = "outboxtest." + id
	if top.RetryDelays == nil {
		top.RetryDelays = testDelays
	}
	if err := outboxrabbitmq.Declare(ch, top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteTopology(t, url, top) })
	d := &destination{top: top, admin: ch, conn: outboxrabbitmq.Connection{URL: url, ReconnectBackoff: 50 * time.Millisecond, MaxReconnectBackoff: time.Second}}
	scfg.Exchange = top.Exchange
	var err error
	if d.sender, err = outboxrabbitmq.NewSender(d.conn, &scfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.sender.Close() })
	rcfg.Queue, rcfg.RetryDelays, rcfg.Ordered = top.Queue, top.RetryDelays, top.Ordered
	if d.receiver, err = outboxrabbitmq.NewReceiver(d.conn, &rcfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.receiver.Close() })
	return d
}

// deleteTopology deletes top's queues and exchange, on a connection of its own (the test's
// channel may have been closed by a broker error).
func deleteTopology(t testing.TB, url string, top outboxrabbitmq.Topology) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("deleting %s: %v", top.Queue, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("deleting %s: %v", top.Queue, err)
		return
	}
	for _, q := range top.QueueNames() {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Errorf("deleting queue %s: %v", q, err)
			return
		}
	}
	if err := ch.ExchangeDelete(top.Exchange, false, false); err != nil {
		t.Errorf("deleting exchange %s: %v", top.Exchange, err)
	}
}

// queueDepth returns how many messages are ready in queue.
func queueDepth(t testing.TB, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}
