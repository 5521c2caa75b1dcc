package outboxnats_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// TestReceiverHoldsAtMostMaxHeldBytes: with the defaults, a stream of large messages that
// nobody acknowledges puts no more than DefaultMaxHeldBytes in the receiver's hands, pull
// after pull; once a message is acknowledged, the next comes.
func TestReceiverHoldsAtMostMaxHeldBytes(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.FileStorage}, outboxnats.SenderConfig{})
	r, err := outboxnats.NewReceiver(d.consumer, &outboxnats.ReceiverConfig{MaxWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 90, 900 << 10 // 79 MiB in all, each under the server's max_payload of 1 MiB
	ctx := context.Background()
	for i := range n {
		m := message("big.blob", "", "")
		m.ContentType, m.Body = "application/octet-stream", bytes.Repeat([]byte{byte(i)}, size)
		if err := d.sender.Send(ctx, []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	var held outboxtest.Unsettled
	// Receive until a Receive brings nothing: all of them, or the cap.
	outboxtest.WaitFor(t, 60*time.Second, "a Receive that brings nothing more", func() bool { return held.Receive(t, r, 10) == 0 })
	t.Logf("the receiver handed out %d of %d messages of %d KiB (%d MiB) without an ack, cap %d MiB",
		len(held.Deliveries), n, size>>10, held.Bytes>>20, outboxnats.DefaultMaxHeldBytes>>20)
	if held.Bytes > outboxnats.DefaultMaxHeldBytes {
		t.Fatalf("the receiver handed out %d bytes not acknowledged, over DefaultMaxHeldBytes (%d)", held.Bytes, outboxnats.DefaultMaxHeldBytes)
	}
	before := len(held.Deliveries)
	if err := held.Deliveries[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 30*time.Second, "the next message once one is acknowledged", func() bool { return held.Receive(t, r, 10) > 0 })
	if len(held.Deliveries) != before+1 {
		t.Errorf("after one ack, %d more message(s) came, want 1", len(held.Deliveries)-before)
	}
	held.AckFrom(t, 1)
}

// TestReceiverTakesAMessageOverMaxHeldBytes: a message larger than MaxHeldBytes still
// comes, alone, when nothing is held.
func TestReceiverTakesAMessageOverMaxHeldBytes(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	r, err := outboxnats.NewReceiver(d.consumer, &outboxnats.ReceiverConfig{MaxWait: 200 * time.Millisecond, MaxHeldBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	big, small := message("t", "", ""), message("t", "", `{"n":1}`)
	big.ContentType, big.Body = "application/octet-stream", bytes.Repeat([]byte{'x'}, 4000)
	if err := d.sender.Send(context.Background(), []outbox.Message{big}); err != nil {
		t.Fatal(err)
	}
	if err := d.sender.Send(context.Background(), []outbox.Message{small}); err != nil {
		t.Fatal(err)
	}
	first := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	if m, _ := first.Message(); m.ID != big.ID {
		t.Fatalf("received %s first, want the large message %s", m.ID, big.ID)
	}
	outboxtest.ExpectNone(t, r, 300*time.Millisecond) // nothing fits beside it
	if err := first.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	if m, _ := next.Message(); m.ID != small.ID {
		t.Fatalf("received %s, want %s", m.ID, small.ID)
	}
	_ = next.Ack(context.Background())
}
