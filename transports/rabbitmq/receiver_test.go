package outboxrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestNackRoundsUpToARetryQueue: Nack(300ms) with retry queues of 200ms, 1s and 2s puts
// the message in the 1s queue (never sooner than asked), acknowledges the original, and
// the message comes back after the second with Attempt 2; a second Nack counts on (3).
func TestNackRoundsUpToARetryQueue(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	ctx := context.Background()
	m := message("a.b", "k", `{"n":1}`)
	if err := d.sender.Send(ctx, []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}
	first := outboxtest.ReceiveN(t, d.receiver, 1, 10*time.Second)[0]
	start := time.Now()
	if err := first.Nack(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if n := queueDepth(t, d.admin, outboxrabbitmq.RetryQueueName(d.top.Queue, time.Second)); n != 1 {
		t.Fatalf("the 1s retry queue holds %d messages right after Nack(300ms), want 1", n)
	}
	again := outboxtest.ReceiveN(t, d.receiver, 1, 10*time.Second)[0]
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("redelivered after %v, before the 1s retry queue's delay", waited)
	}
	got, err := again.Message()
	if err != nil || got.ID != m.ID || again.Attempt() != 2 {
		t.Fatalf("redelivery: %s attempt %d (%v), want %s attempt 2", got.ID, again.Attempt(), err, m.ID)
	}
	if err := outboxtest.SameMessage(got, m); err != nil {
		t.Error(err)
	}
	if err := again.Nack(ctx, 0); err != nil { // requeued in place: the queue's own count
		t.Fatal(err)
	}
	third := outboxtest.ReceiveN(t, d.receiver, 1, 10*time.Second)[0]
	if third.Attempt() != 3 {
		t.Errorf("after a retry queue and a requeue, Attempt %d, want 3", third.Attempt())
	}
	if err := third.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	outboxtest.ExpectNone(t, d.receiver, 300*time.Millisecond)
}

// TestMalformedKeepsEvidence: a message that is not a CloudEvent arrives as an
// *outbox.MalformedError with its body, headers and message-id exactly as sent.
func TestMalformedKeepsEvidence(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	err := d.admin.PublishWithContext(context.Background(), d.top.Exchange, "legacy", true, false, amqp.Publishing{
		MessageId: "legacy-42", ContentType: "text/plain", Body: []byte("hello"),
		Headers: amqp.Table{"cloudEvents:type": "legacy.thing", "tenant": "acme"},
	})
	if err != nil {
		t.Fatal(err)
	}
	dl := outboxtest.ReceiveN(t, d.receiver, 1, 10*time.Second)[0]
	_, err = dl.Message()
	var me *outbox.MalformedError
	if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
		t.Fatalf("Message() error = %v, want an *outbox.MalformedError", err)
	}
	if string(me.Body) != "hello" || me.BrokerMessageID != "legacy-42" || me.Attributes["tenant"] != "acme" ||
		me.Attributes["content-type"] != "text/plain" || me.Partial.Type != "legacy.thing" {
		t.Errorf("malformed error kept %+v", me)
	}
	if err := dl.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestForeignProducer: a CloudEvent from another producer, with the binding's other
// spelling, the "cloudEvents:" prefix (earlier versions of this transport wrote it), and a
// native AMQP timestamp, is read.
func TestForeignProducer(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	m := message("a.b", "", `{"n":1}`)
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	err := d.admin.PublishWithContext(context.Background(), d.top.Exchange, "a.b", true, false, amqp.Publishing{
		ContentType: "application/json", Body: m.Body,
		Headers: amqp.Table{"cloudEvents:specversion": "1.0", "cloudEvents:id": m.ID.String(), "cloudEvents:type": "a.b",
			"cloudEvents:source": "/java", "cloudEvents:time": at},
	})
	if err != nil {
		t.Fatal(err)
	}
	dl := outboxtest.ReceiveN(t, d.receiver, 1, 10*time.Second)[0]
	got, err := dl.Message()
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != m.ID || got.Type != "a.b" || !got.CreatedAt.Equal(at) || string(got.Body) != `{"n":1}` {
		t.Errorf("read %+v", got)
	}
	_ = dl.Ack(context.Background())
}

// TestReceiverReconnects: the receiver's connection drops with a message unacknowledged.
// Acking it fails (the broker requeued it); the receiver reconnects and the message comes
// again with Attempt 2.
func TestReceiverReconnects(t *testing.T) {
	t.Parallel()
	p := newProxy(t, brokerAddr(t))
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	r, err := outboxrabbitmq.NewReceiver(outboxrabbitmq.Connection{URL: viaProxy(t, p), ReconnectBackoff: 50 * time.Millisecond},
		&outboxrabbitmq.ReceiverConfig{Queue: d.top.Queue, RetryDelays: d.top.RetryDelays, MaxWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	m := message("a.b", "", `{}`)
	if err := d.sender.Send(ctx, []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}
	first := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	p.cut()
	outboxtest.WaitFor(t, 10*time.Second, "the ack on the lost channel to fail", func() bool {
		err = first.Ack(ctx)
		return err != nil
	})
	if !strings.Contains(err.Error(), "requeued") {
		t.Errorf("Ack error %q does not say the broker requeued the message", err)
	}
	var again outbox.Delivery
	outboxtest.WaitFor(t, 10*time.Second, "the message to come again after the reconnect", func() bool {
		ds, _ := r.Receive(ctx, 1) // the first Receive after the loss reports it
		if len(ds) > 0 {
			again = ds[0]
		}
		return again != nil
	})
	got, _ := again.Message()
	if got.ID != m.ID || again.Attempt() != 2 {
		t.Errorf("after the reconnect: %s attempt %d, want %s attempt 2", got.ID, again.Attempt(), m.ID)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if n := r.Reconnects(); n != 1 {
		t.Errorf("receiver reconnected %d times, want 1", n)
	}
}

// TestReceiverMissingQueue: consuming a queue that does not exist fails with an error that
// names the queue and the fix.
func TestReceiverMissingQueue(t *testing.T) {
	t.Parallel()
	admin(t, outboxtest.AMQPURL())
	r, err := outboxrabbitmq.NewReceiver(outboxrabbitmq.Connection{URL: outboxtest.AMQPURL()}, &outboxrabbitmq.ReceiverConfig{Queue: "outboxtest.missing." + unique()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = r.Receive(context.Background(), 1)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "Declare") {
		t.Fatalf("Receive = %v, want an error naming the missing queue and Declare", err)
	}
}

// TestOrderedRetryHoldsItsPlace: on an ordered queue a nacked message is held and handed
// out again, Attempt counting on, before the next message — which a requeue would not do
// (RabbitMQ 3.x quorum queues requeue at the back; the ordered end-to-end test caught it).
func TestOrderedRetryHoldsItsPlace(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{Ordered: true}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	ctx := context.Background()
	a, b := message("a.b", "k", `{"n":1}`), message("a.b", "k", `{"n":2}`)
	for _, m := range []outbox.Message{a, b} {
		if err := d.sender.Send(ctx, []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for i := range 4 {
		dl := outboxtest.ReceiveN(t, d.receiver, 1, 10*time.Second)[0]
		m, _ := dl.Message()
		got = append(got, fmt.Sprintf("%s@%d", m.Body, dl.Attempt()))
		if i < 2 {
			err := dl.Nack(ctx, time.Duration(i)*100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := dl.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{`{"n":1}@1`, `{"n":1}@2`, `{"n":1}@3`, `{"n":2}@1`}; !slices.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
}
