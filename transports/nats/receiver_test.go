package outboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

func TestNewReceiverReportsEveryProblem(t *testing.T) {
	_, js := connect(t)
	stream, _ := provision(t, js, outboxnats.Topology{Stream: "OUTBOXTEST_" + unique(), Subjects: []string{"outboxtest." + unique() + ".>"}, Storage: jetstream.MemoryStorage})
	ctx := context.Background()
	c, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "noack", AckPolicy: jetstream.AckNonePolicy, MaxRequestExpires: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = outboxnats.NewReceiver(c, &outboxnats.ReceiverConfig{MaxWait: time.Minute})
	if err == nil {
		t.Fatal("NewReceiver accepted a consumer without explicit acks")
	}
	for _, want := range []string{"AckPolicy AckNone", "MaxWait 1m0s is over consumer noack's MaxRequestExpires of 1s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if _, err := outboxnats.NewReceiver(c, &outboxnats.ReceiverConfig{MaxWait: time.Millisecond}); err == nil || !strings.Contains(err.Error(), "MaxWait 1ms is under 10ms") {
		t.Errorf("MaxWait 1ms: err = %v", err)
	}
}

// TestReceiveHonoursContext: a long poll ends as soon as its context does.
func TestReceiveHonoursContext(t *testing.T) {
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	r, err := outboxnats.NewReceiver(d.consumer, &outboxnats.ReceiverConfig{MaxWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(100*time.Millisecond, cancel)
	defer stop.Stop()
	ds, err := r.Receive(ctx, 10) // would wait a minute if the context were ignored
	if !errors.Is(err, context.Canceled) || len(ds) != 0 {
		t.Fatalf("Receive = %d deliveries, %v; want context.Canceled", len(ds), err)
	}
}

// TestAsyncAck: with AsyncAck, Ack does not wait for the server, and the message is gone
// all the same.
func TestAsyncAck(t *testing.T) {
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	r, err := outboxnats.NewReceiver(d.consumer, &outboxnats.ReceiverConfig{AsyncAck: true, MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.sender.Send(context.Background(), []outbox.Message{message("t", "", "{}")}); err != nil {
		t.Fatal(err)
	}
	dl := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	if err := dl.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	outboxtest.ExpectNone(t, r, time.Second)
}

// sendInTurn sends msgs one call each, as the relay sends a key's messages.
func sendInTurn(t *testing.T, s outbox.Sender, msgs ...outbox.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := s.Send(context.Background(), []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
}

func expectNext(t *testing.T, r outbox.Receiver, want outbox.Message, attempt int) outbox.Delivery {
	t.Helper()
	d := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	got, err := d.Message()
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != want.ID || d.Attempt() != attempt {
		t.Fatalf("received %s (attempt %d), want %s (attempt %d)", got.Body, d.Attempt(), want.Body, attempt)
	}
	return d
}

// TestOrderedConsumer: with MaxAckPending 1, a key's messages arrive in send order even when
// the first is retried, with and without a delay: FIFO, as destination.features says.
func TestOrderedConsumer(t *testing.T) {
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage, Ordered: true}, outboxnats.SenderConfig{})
	if f := d.features(); !f.FIFO || !f.Dedup {
		t.Fatalf("features = %+v, want FIFO and Dedup", f)
	}
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, message("t", "a", fmt.Sprintf(`{"a":%d}`, i)))
	}
	msgs = append(msgs, message("t", "b", `{"b":0}`))
	sendInTurn(t, d.sender, msgs...)

	ctx := context.Background()
	if err := expectNext(t, d.receiver, msgs[0], 1).Nack(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := expectNext(t, d.receiver, msgs[0], 2).Nack(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		attempt := 1
		if i == 0 {
			attempt = 3
		}
		if err := expectNext(t, d.receiver, m, attempt).Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.ExpectNone(t, d.receiver, 500*time.Millisecond)
}

// TestStandardConsumerIsNotFIFO shows why a consumer with several messages in flight is not
// FIFO: a retried message is overtaken by the next of its key.
func TestStandardConsumerIsNotFIFO(t *testing.T) {
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	if f := d.features(); f.FIFO {
		t.Fatalf("features = %+v, want FIFO false", f)
	}
	first, second := message("t", "a", `{"a":0}`), message("t", "a", `{"a":1}`)
	sendInTurn(t, d.sender, first, second)
	if err := expectNext(t, d.receiver, first, 1).Nack(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := expectNext(t, d.receiver, second, 1).Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestReceiveAtMaxAckPending: a consumer at its MaxAckPending limit hands out nothing more,
// and the next message arrives, through the long poll, once a held one is acked.
func TestReceiveAtMaxAckPending(t *testing.T) {
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	ctx := context.Background()
	c, err := d.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "two", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 2})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outboxnats.NewReceiver(c, &outboxnats.ReceiverConfig{MaxWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{message("t", "", "1"), message("t", "", "2"), message("t", "", "3")}
	if err := d.sender.Send(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	held := outboxtest.ReceiveN(t, r, 2, 10*time.Second)

	third := make(chan []outbox.Delivery, 1)
	go func() {
		ds, err := r.Receive(ctx, 10)
		if err != nil {
			t.Error(err)
		}
		third <- ds
	}()
	if err := held[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-third // within MaxWait (10s) of the ack
	if len(got) == 0 {
		t.Fatal("the long poll ended without the message freed by the ack")
	}
	if m, _ := got[0].Message(); len(got) != 1 || m.ID != msgs[2].ID {
		t.Fatalf("received %d deliveries (first %s), want the third message alone", len(got), m.ID)
	}
	for _, dl := range append(held[1:], got...) {
		if err := dl.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
