package outboxrabbitmq_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

func message(typ, key, body string) outbox.Message {
	return outbox.Message{
		ID: uuid.Must(uuid.NewV7()), Type: typ, Key: key, ContentType: "application/json",
		Body: []byte(body), CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
}

// viaProxy returns the test broker's URL with its address replaced by p's.
func viaProxy(t testing.TB, p *proxy) string {
	t.Helper()
	u, err := amqp.ParseURI(outboxtest.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.addr())
	u.Host = host
	u.Port, _ = strconv.Atoi(port)
	return u.String()
}

func brokerAddr(t testing.TB) string {
	t.Helper()
	u, err := amqp.ParseURI(outboxtest.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// TestWireFormat: a sent message is persistent, routed by its type, carries the event ID
// as message-id (the replay-marked DedupID for a replay), datacontenttype as content-type
// and the other CloudEvents attributes as cloudEvents_-prefixed string headers.
func TestWireFormat(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{Source: "/orders-service"}, outboxrabbitmq.ReceiverConfig{})
	m := message("orders.created", "customer-7", `{"n":1}`)
	m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
	replay := message("orders.created", "", `{"n":2}`)
	replay.Headers = map[string]string{outbox.ReplayHeader: "7"}
	if err := d.sender.Send(context.Background(), []outbox.Message{m, replay}); err != nil {
		t.Fatal(err)
	}
	var got []amqp.Delivery
	outboxtest.WaitFor(t, 10*time.Second, "both messages in the queue", func() bool {
		dl, ok, err := d.admin.Get(d.top.Queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, dl)
		}
		return len(got) == 2
	})
	g := got[0]
	want := map[string]string{
		"cloudEvents_specversion":  "1.0",
		"cloudEvents_id":           m.ID.String(),
		"cloudEvents_type":         "orders.created",
		"cloudEvents_source":       "/orders-service",
		"cloudEvents_time":         m.CreatedAt.Format(time.RFC3339Nano),
		"cloudEvents_partitionkey": "customer-7",
		"cloudEvents_traceparent":  m.Headers["traceparent"],
		"cloudEvents_txheaders":    `{"X-Tenant":"acme"}`,
	}
	for k, v := range want {
		if g.Headers[k] != v {
			t.Errorf("header %s = %#v, want %q", k, g.Headers[k], v)
		}
	}
	for k := range g.Headers {
		if strings.HasPrefix(k, "x-") { // the queue's own (x-delivery-count)
			delete(g.Headers, k)
		}
	}
	if len(g.Headers) != len(want) {
		t.Errorf("headers %v, want exactly %v", g.Headers, want)
	}
	if g.ContentType != "application/json" || g.MessageId != m.ID.String() || g.DeliveryMode != amqp.Persistent ||
		g.RoutingKey != "orders.created" || g.Type != "orders.created" || g.Exchange != d.top.Exchange {
		t.Errorf("properties: content-type %q, message-id %q, delivery mode %d, routing key %q, type %q, exchange %q",
			g.ContentType, g.MessageId, g.DeliveryMode, g.RoutingKey, g.Type, g.Exchange)
	}
	if got[1].MessageId != replay.DedupID() || !strings.Contains(got[1].MessageId, "replay") {
		t.Errorf("replay message-id %q, want %q", got[1].MessageId, replay.DedupID())
	}
}

// TestSenderUnroutableFails: with mandatory publishing, a message no queue is bound for
// comes back from the broker and fails, alone; the rest of the batch is delivered.
func TestSenderUnroutableFails(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{Bindings: []string{"orders.*"}}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	msgs := []outbox.Message{message("orders.created", "", `{}`), message("nobody.listens", "", `{}`), message("orders.paid", "", `{}`)}
	err := d.sender.Send(context.Background(), msgs)
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[1] == nil {
		t.Fatalf("Send = %v, want a BatchError failing message 1 only", err)
	}
	if msg := be.Failed[1].Error(); !strings.Contains(msg, "unroutable") || !strings.Contains(msg, `"nobody.listens"`) {
		t.Errorf("error %q does not say the message was unroutable and its routing key", msg)
	}
	if outbox.IsPermanent(be.Failed[1]) {
		t.Error("an unroutable message failed permanently; a binding may yet be created, so the relay should retry it")
	}
	if outbox.IsUnavailable(be.Failed[1]) {
		t.Error("an unroutable message failed as the broker's fault; the broker took the rest of the batch, so it is the message's routing")
	}
	got := map[uuid.UUID]bool{}
	outboxtest.ReceiveEach(t, d.receiver, 2, 10*time.Second, func(dl outbox.Delivery) {
		m, _ := dl.Message()
		got[m.ID] = true
		_ = dl.Ack(context.Background())
	})
	if !got[msgs[0].ID] || !got[msgs[2].ID] {
		t.Errorf("received %v, want messages 0 and 2", got)
	}
	outboxtest.ExpectNone(t, d.receiver, 300*time.Millisecond)
}

// TestSenderMissingExchange: publishing to an exchange that does not exist (yet) fails the
// batch as the broker's fault (outbox.Unavailable: the relay waits for it, spending no
// attempt) with an error that names the exchange and the fix.
func TestSenderMissingExchange(t *testing.T) {
	t.Parallel()
	admin(t, outboxtest.AMQPURL())
	s, err := outboxrabbitmq.NewSender(outboxrabbitmq.Connection{URL: outboxtest.AMQPURL()}, &outboxrabbitmq.SenderConfig{Exchange: "outboxtest.missing." + unique()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Send(context.Background(), []outbox.Message{message("a.b", "", `{}`)})
	if err == nil || !strings.Contains(err.Error(), "outboxtest.missing.") || !strings.Contains(err.Error(), "Declare") {
		t.Fatalf("Send = %v, want an error naming the missing exchange and Declare", err)
	}
	if !outbox.IsUnavailable(err) {
		t.Errorf("Send = %v, want it marked unavailable", err)
	}
}

// TestSenderConfirmNeverCame: the broker's replies stop (a half-dead connection) after the
// messages were published; Send fails every message once its context ends — the relay
// retries them — and the next Send reconnects and succeeds.
func TestSenderConfirmNeverCame(t *testing.T) {
	t.Parallel()
	p := newProxy(t, brokerAddr(t))
	d := newDestinationAt(t, viaProxy(t, p), outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	direct := admin(t, outboxtest.AMQPURL())
	ctx := context.Background()
	if err := d.sender.Send(ctx, []outbox.Message{message("a.b", "", `{"n":0}`)}); err != nil {
		t.Fatal(err)
	}
	p.stall()
	msgs := []outbox.Message{message("a.b", "", `{"n":1}`), message("a.b", "", `{"n":2}`)}
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err := d.sender.Send(sctx, msgs)
	cancel()
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 2 {
		t.Fatalf("Send with the confirms cut off = %v, want a BatchError failing both messages", err)
	}
	for i, e := range be.Failed {
		if !strings.Contains(e.Error(), "no confirm") || !errors.Is(e, context.DeadlineExceeded) || !outbox.IsUnavailable(e) {
			t.Errorf("message %d: %v, want a missing confirm marked unavailable", i, e)
		}
	}
	p.cut()
	outboxtest.WaitFor(t, 10*time.Second, "a Send after the reconnect to succeed", func() bool {
		return d.sender.Send(ctx, []outbox.Message{message("a.b", "", `{"n":3}`)}) == nil
	})
	if n := d.sender.Reconnects(); n != 1 {
		t.Errorf("sender reconnected %d times, want 1", n)
	}
	// The unconfirmed messages reached the broker all the same: a relay's retry of them
	// is a duplicate, which the consumer's inbox absorbs.
	outboxtest.WaitFor(t, 10*time.Second, "the 4 messages in the queue", func() bool {
		return queueDepth(t, direct, d.top.Queue) == 4
	})
}

// TestSenderConfigErrors: invalid settings fail at construction, all named at once, and
// the URL's password is in none of them.
func TestSenderConfigErrors(t *testing.T) {
	_, err := outboxrabbitmq.NewSender(outboxrabbitmq.Connection{URL: "amqp://u:s3cret@host:5672/%zz", ReconnectBackoff: time.Minute},
		&outboxrabbitmq.SenderConfig{RoutingKey: func(outbox.Message) string { return "" }, RoutingKeys: map[string]string{"a": ""}, MaxMessageBytes: -1})
	if err == nil {
		t.Fatal("NewSender accepted an invalid configuration")
	}
	for _, want := range []string{"URL", "ReconnectBackoff", "RoutingKey is set together with RoutingKeys", `RoutingKeys["a"]`, "MaxMessageBytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q shows the password", err)
	}
}
