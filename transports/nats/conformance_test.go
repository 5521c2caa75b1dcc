package outboxnats_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// TestConformance runs the transport suite against nats-server, with a fresh stream per
// subtest:
//   - "standard": 1000 messages in flight, the server's max payload as the limit;
//   - "stream-limit": a stream max_msg_size of 4 KiB that the sender is not told about, so
//     the server's refusal must come back as outbox.ErrTooLarge;
//   - "ordered": MaxAckPending 1, which promises FIFO.
func TestConformance(t *testing.T) {
	_, js := connect(t)
	for _, v := range []struct {
		name   string
		top    outboxnats.Topology
		outage bool // the Outage subtests run on a private nats-server
	}{
		{name: "standard", top: outboxnats.Topology{Storage: jetstream.MemoryStorage}, outage: true},
		{name: "stream-limit", top: outboxnats.Topology{Storage: jetstream.MemoryStorage, MaxMsgSize: 4096}},
		{name: "ordered", top: outboxnats.Topology{Storage: jetstream.MemoryStorage, Ordered: true}, outage: true},
	} {
		t.Run(v.name, func(t *testing.T) {
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				d := newDestination(t, js, v.top, outboxnats.SenderConfig{})
				var outage func(t *testing.T) *outboxtest.OutageFixture
				if v.outage {
					outage = func(t *testing.T) *outboxtest.OutageFixture { return natsOutage(t, v.top) }
				}
				return &outboxtest.TransportFixture{
					Outage:   outage,
					Sender:   d.sender,
					Receiver: d.receiver,
					Features: d.features(),
					SendRaw: func(ctx context.Context, body []byte) error {
						_, err := js.Publish(ctx, d.prefix+".raw", body)
						return err
					},
					SendForeign: func(ctx context.Context, m outboxtest.ForeignMessage) error {
						msg := &nats.Msg{Subject: d.prefix + ".foreign", Header: nats.Header{}, Data: m.Body}
						for k, v := range m.Headers {
							msg.Header[k] = []string{v} // as written: NATS header names are case-sensitive
						}
						_, err := js.PublishMsg(ctx, msg)
						return err
					},
					ReceiveForeign: func(ctx context.Context) (outboxtest.ForeignMessage, error) {
						return receiveForeign(ctx, d.consumer)
					},
				}
			})
		})
	}
}

// receiveForeign takes the next message from c with the NATS client alone, and acks it.
func receiveForeign(ctx context.Context, c jetstream.Consumer) (outboxtest.ForeignMessage, error) {
	for {
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return outboxtest.ForeignMessage{}, err
		}
		for msg := range batch.Messages() {
			m := outboxtest.ForeignMessage{Headers: map[string]string{}, Body: msg.Data()}
			for k, vs := range msg.Headers() {
				m.Headers[k] = strings.Join(vs, ",")
			}
			return m, msg.DoubleAck(ctx)
		}
		if err := ctx.Err(); err != nil {
			return outboxtest.ForeignMessage{}, err
		}
	}
}

// natsOutage is a destination on a private nats-server with JetStream on file storage, which
// the suite kills and starts again on the same port and store directory.
func natsOutage(t *testing.T, top outboxnats.Topology) *outboxtest.OutageFixture {
	srv := startNATSServer(t)
	_, js := connectPrivate(t, srv, t.Name())
	top.Storage = jetstream.FileStorage // the stream outlives the server's restart
	top.AckWait = 2 * time.Second       // an ack lost with the server comes back soon
	d := newDestination(t, js, top, outboxnats.SenderConfig{})
	return &outboxtest.OutageFixture{
		Sender:   d.sender,
		Receiver: d.receiver,
		Features: d.features(),
		Stop:     func(testing.TB) { srv.Kill() },
		Start:    func(testing.TB) { srv.Start() },
		Pipeline: func(t *testing.T) *outboxtest.PipelineFixture {
			return pgxtest.New(t, "outboxnats").Pipeline(t, d.sender, d.receiver)
		},
	}
}
