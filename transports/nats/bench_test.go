package outboxnats_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// BenchmarkJetStream compares, in one run and against the same server and file-backed
// streams, the rate at which events reach a JetStream stream:
//
//   - bare: a plain nats.go async-publish loop (body and Nats-Msg-Id), then waiting for all
//     acks: the broker's own publish rate from a client;
//   - sender: outboxnats.Sender.Send in batches of 500, without a database;
//   - relay-batchN: events already committed to a PostgreSQL outbox, drained by the relay
//     (claim, send, delete) in batches of N (500 is the relay's default).
//
// Each reports events/s. Run with a fixed count, e.g.
//
//	go test -run '^$' -bench BenchmarkJetStream -benchtime 20000x
func BenchmarkJetStream(b *testing.B) {
	_, js := connect(b)
	body := []byte(`{"order_id":"o-123456","note":"benchmark event"}`)
	fresh := func(b *testing.B) *destination {
		return newDestination(b, js, outboxnats.Topology{}, outboxnats.SenderConfig{})
	}

	b.Run("bare", func(b *testing.B) {
		d := fresh(b)
		ids := make([]string, b.N)
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7()).String()
		}
		subject := d.prefix + "." + orderPlaced{}.EventType()
		b.ResetTimer()
		for i := range b.N {
			m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{jetstream.MsgIDHeader: []string{ids[i]}}}
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		<-js.PublishAsyncComplete()
		reportRate(b, d)
	})

	b.Run("sender", func(b *testing.B) {
		d := fresh(b)
		msgs := make([]outbox.Message, b.N)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: orderPlaced{}.EventType(), ContentType: "application/json", Body: body}
		}
		b.ResetTimer()
		for start := 0; start < len(msgs); start += 500 {
			if err := d.sender.Send(context.Background(), msgs[start:min(start+500, len(msgs))]); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b, d)
	})

	for _, batch := range []int{500, 1000} {
		b.Run(fmt.Sprintf("relay-batch%d", batch), func(b *testing.B) { benchRelay(b, fresh(b), batch) })
	}
}

// benchRelay drains b.N committed events from a fresh PostgreSQL outbox to d, calling
// RunOnce until a claim comes back empty.
func benchRelay(b *testing.B, d *destination, batch int) {
	p := newPGOutbox(b)
	for start := 0; start < b.N; start += 1000 {
		var events []outbox.Encodable
		for i := start; i < min(start+1000, b.N); i++ {
			events = append(events, outbox.New(orderPlaced{OrderID: fmt.Sprint(i), Note: "benchmark event"}))
		}
		p.publish(b, events...)
	}
	relay := quietRelay(b, p, d.sender, outbox.RelayConfig{BatchSize: batch})
	b.ResetTimer()
	for {
		n, err := relay.RunOnce(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	reportRate(b, d)
}

// reportRate stops the timer, reports events/s and checks the stream got b.N messages.
func reportRate(b *testing.B, d *destination) {
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if n := streamMsgs(b, d.stream); n != uint64(b.N) {
		b.Fatalf("stream holds %d messages, want %d", n, b.N)
	}
}
