package outboxkafka_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// TestReceiverHoldsAtMostMaxHeldBytes: with the defaults, a topic of large records that
// nobody acknowledges puts no more than DefaultMaxHeldBytes (and one Receive's records)
// in the receiver's hands; once records are acknowledged, the next come.
func TestReceiverHoldsAtMostMaxHeldBytes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := newClient(t, c, kgo.ProducerBatchMaxBytes(1<<20))
	topic := createTopicN(t, cl, 1, nil)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	const n, size, limit = 100, 900 << 10, 10 // 88 MiB in all, each record within Kafka's default 1 MiB
	ctx := context.Background()
	for i := range n {
		m := message("big.blob", "", "")
		m.ContentType, m.Body = "application/octet-stream", bytes.Repeat([]byte{byte(i)}, size)
		if err := s.Send(ctx, []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	r := newReceiver(t, c, outboxkafka.ReceiverConfig{Topics: []string{topic}, MaxWait: 300 * time.Millisecond})
	var held outboxtest.Unsettled
	// Receive until the receiver holds its fill (or everything), then until a Receive
	// brings nothing more.
	outboxtest.WaitFor(t, 60*time.Second, "the receiver to hand out its fill", func() bool {
		held.Receive(t, r, limit)
		return held.Bytes >= outboxkafka.DefaultMaxHeldBytes-size || len(held.Deliveries) == n
	})
	outboxtest.WaitFor(t, 60*time.Second, "a Receive that brings nothing more", func() bool { return held.Receive(t, r, limit) == 0 })
	bound := outboxkafka.DefaultMaxHeldBytes + limit*size
	t.Logf("the receiver handed out %d of %d records of %d KiB (%d MiB) without an ack; bound %d MiB",
		len(held.Deliveries), n, size>>10, held.Bytes>>20, bound>>20)
	if held.Bytes > bound {
		t.Fatalf("the receiver handed out %d bytes not acknowledged, over DefaultMaxHeldBytes and one Receive (%d)", held.Bytes, bound)
	}
	before := len(held.Deliveries)
	held.AckFrom(t, 0)
	outboxtest.WaitFor(t, 30*time.Second, "more records once those are acknowledged", func() bool { return held.Receive(t, r, limit) > 0 })
	held.AckFrom(t, before)
}
