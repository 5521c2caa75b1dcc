package outboxrabbitmq_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/benchtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// BenchmarkRabbitMQ compares, in one run and against the same broker, the rate at which
// events reach a quorum queue by three paths:
//
//   - bare: a plain amqp091-go loop on a confirm-mode channel publishing the same messages
//     the Sender sends (persistent, mandatory, the cloudEvents_ headers, message-id), in
//     batches of 500, waiting for every confirm of a batch: the broker's own rate from a
//     client that gives the same guarantee;
//   - sender: outboxrabbitmq.Sender.Send in batches of 500, without a database;
//   - relay: events committed to a PostgreSQL outbox, drained by a relay with the default
//     config (Run: batches of 500), timed until Run has returned with every batch written
//     back.
//
// b.N is the number of events each path sends; the paths take turns in rounds of 10,000
// events, so load from elsewhere on the machine weighs on all of them alike. Reported:
// events/s of each path, relay/bare and sender/bare, and the machine's busy CPU time per
// event of each path. Run it with a fixed count:
//
//	go test -run '^$' -bench BenchmarkRabbitMQ -benchtime 30000x
func BenchmarkRabbitMQ(b *testing.B) {
	body := []byte(`{"order_id":"o-123456","note":"benchmark event"}`)
	typ := orderPlaced{}.EventType()
	fresh := func() *destination {
		return newDestination(b, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	}
	newMessages := func(n int) []outbox.Message {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: typ, ContentType: "application/json", Body: body, CreatedAt: time.Now().UTC()}
		}
		return msgs
	}
	// What a bare client publishes for m: the Sender's message, built by hand.
	publishing := func(m outbox.Message) amqp.Publishing {
		id := m.ID.String()
		return amqp.Publishing{
			Headers: amqp.Table{
				"cloudEvents_specversion": "1.0", "cloudEvents_id": id, "cloudEvents_type": m.Type,
				"cloudEvents_source": "/txoutbox", "cloudEvents_time": m.CreatedAt.Format(time.RFC3339Nano),
			},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Type: m.Type,
			Timestamp: m.CreatedAt, Body: m.Body,
		}
	}
	bareDst := fresh()
	probe := newMessages(1)[0]
	if got, want := must(outboxrabbitmq.Encode(bareDst.sender, probe)), publishing(probe); !maps.Equal(got.Headers, want.Headers) ||
		got.ContentType != want.ContentType || got.MessageId != want.MessageId || got.DeliveryMode != want.DeliveryMode {
		b.Fatalf("the bare loop publishes %+v, the Sender %+v", want, got)
	}
	conn, err := amqp.Dial(outboxtest.AMQPURL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	bare := func(d *destination, n int) func() {
		msgs := newMessages(n)
		return func() {
			ctx := context.Background()
			for start := 0; start < n; start += 500 {
				confirms := make([]*amqp.DeferredConfirmation, 0, 500)
				for _, m := range msgs[start:min(start+500, n)] {
					dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, d.top.Exchange, m.Type, true, false, publishing(m))
					if err != nil {
						b.Fatal(err)
					}
					confirms = append(confirms, dc)
				}
				for _, dc := range confirms {
					if ok, err := dc.WaitContext(ctx); !ok || err != nil {
						b.Fatalf("confirm: %v, %v", ok, err)
					}
				}
			}
		}
	}
	sender := func(d *destination, n int) func() {
		msgs := newMessages(n)
		return func() {
			for start := 0; start < n; start += 500 {
				if err := d.sender.Send(context.Background(), msgs[start:min(start+500, n)]); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	pg := pgxtest.New(b, "outboxrabbitmq")
	relayDst := fresh()
	relay := benchtest.RelayPath(b, pg.Store(b), relayDst.sender, func(n int) {
		for start := 0; start < n; start += 1000 {
			events := make([]outbox.Encodable, 0, 1000)
			for range min(1000, n-start) {
				events = append(events, outbox.New(orderPlaced{OrderID: "o-123456", Note: "benchmark event"}))
			}
			pg.Commit(b, events...)
		}
	})

	paths := []struct {
		name    string
		dst     *destination
		prepare func(d *destination, n int) func() // readies n events untimed, returns the timed part
	}{
		{"bare", bareDst, bare},
		{"sender", fresh(), sender},
		{"relay", relayDst, func(_ *destination, n int) func() { return relay(n) }},
	}
	var rounds []*benchtest.Path
	for _, p := range paths {
		rounds = append(rounds, &benchtest.Path{Name: p.name, Prepare: func(n int) func() { return p.prepare(p.dst, n) }})
	}
	rate := benchtest.Rounds(b, 10000, nil, rounds...)

	for _, p := range paths {
		if got := queueDepth(b, p.dst.admin, p.dst.top.Queue); got != b.N {
			b.Fatalf("%s: the queue holds %d messages, want %d", p.name, got, b.N)
		}
	}
	if left := pg.Count(b, "outbox"); left != 0 {
		b.Fatalf("%d events left in the outbox, want 0", left)
	}
	b.ReportMetric(rate["relay"]/rate["bare"], "relay/bare")
	b.ReportMetric(rate["sender"]/rate["bare"], "sender/bare")
}
