package outboxrabbitmq_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestReceiverHoldsAtMostMaxHeldBytes: RabbitMQ's prefetch counts messages, not bytes, and
// the broker pushes that many whatever their size. With the defaults, a queue of large
// messages that nobody acknowledges puts no more than DefaultMaxHeldBytes of bodies in the
// receiver's hands; once a message is acknowledged, the next comes.
func TestReceiverHoldsAtMostMaxHeldBytes(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{MaxWait: 100 * time.Millisecond})
	const n, size = 10, 8 << 20 // 80 MiB in all, each message within the default MaxMessageBytes
	ctx := context.Background()
	for i := range n {
		m := message("big.blob", "", "")
		m.ContentType, m.Body = "application/octet-stream", bytes.Repeat([]byte{byte('a' + i)}, size)
		if err := d.sender.Send(ctx, []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	var held outboxtest.Unsettled
	// Everything the broker pushed is in hand once the messages still ready in the queue and
	// those received add up to all of them.
	outboxtest.WaitFor(t, 30*time.Second, "the receiver to hold what the broker pushed", func() bool {
		held.Receive(t, d.receiver, 100)
		return len(held.Deliveries) > 0 && queueDepth(t, d.admin, d.top.Queue)+len(held.Deliveries) == n
	})
	t.Logf("the receiver holds %d of %d messages of %d MiB (%d MiB), cap %d MiB",
		len(held.Deliveries), n, size>>20, held.Bytes>>20, outboxrabbitmq.DefaultMaxHeldBytes>>20)
	if held.Bytes > outboxrabbitmq.DefaultMaxHeldBytes {
		t.Fatalf("the receiver holds %d bytes unacknowledged, over DefaultMaxHeldBytes (%d)", held.Bytes, outboxrabbitmq.DefaultMaxHeldBytes)
	}
	if len(held.Deliveries) == n {
		t.Fatalf("the broker pushed all %d messages", n)
	}
	if err := held.Deliveries[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 30*time.Second, "the next message once one is acknowledged", func() bool {
		return held.Receive(t, d.receiver, 100) > 0
	})
	held.AckFrom(t, 1)
}

// TestReceiverConfigHeldBytes: the default Prefetch is what MaxHeldBytes allows at
// MaxMessageBytes (at most 100, at least 1), and a Prefetch set over it is refused with
// the way out.
func TestReceiverConfigHeldBytes(t *testing.T) {
	conn := outboxrabbitmq.Connection{URL: "amqp://guest:guest@127.0.0.1:5672/"}
	for _, c := range []struct {
		cfg  outboxrabbitmq.ReceiverConfig
		want int
	}{
		{cfg: outboxrabbitmq.ReceiverConfig{}, want: outboxrabbitmq.DefaultMaxHeldBytes / outboxrabbitmq.DefaultMaxMessageBytes},
		{cfg: outboxrabbitmq.ReceiverConfig{MaxMessageBytes: 64 << 10}, want: 100},
		{cfg: outboxrabbitmq.ReceiverConfig{MaxMessageBytes: 1 << 20}, want: 64},
		{cfg: outboxrabbitmq.ReceiverConfig{MaxMessageBytes: 128 << 20}, want: 1},
		{cfg: outboxrabbitmq.ReceiverConfig{MaxHeldBytes: 1 << 30, Prefetch: 50}, want: 50},
		{cfg: outboxrabbitmq.ReceiverConfig{Ordered: true}, want: 1},
	} {
		c.cfg.Queue = "q"
		if got := c.cfg.WithDefaults().Prefetch; got != c.want {
			t.Errorf("%+v: Prefetch %d, want %d", c.cfg, got, c.want)
		}
		if _, err := outboxrabbitmq.NewReceiver(conn, &c.cfg); err != nil {
			t.Errorf("%+v: %v", c.cfg, err)
		}
	}
	_, err := outboxrabbitmq.NewReceiver(conn, &outboxrabbitmq.ReceiverConfig{Queue: "q", Prefetch: 100})
	if err == nil || !strings.Contains(err.Error(), "MaxHeldBytes") {
		t.Errorf("Prefetch 100 of 16 MiB messages under a 64 MiB cap: %v, want an error naming MaxHeldBytes", err)
	}
}
