package outboxnats_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/benchtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// BenchmarkJetStream compares, in one run and against the same server, the rate at which
// events reach a JetStream stream (file storage) by these paths:
//
//   - bare: a plain nats.go async-publish loop (body and Nats-Msg-Id), then waiting for all
//     acks: the broker's own publish rate from a client;
//   - bare-ce: the same loop sending the headers the Sender sends (the CloudEvents
//     attributes, Nats-Msg-Id, Nats-Expected-Stream), each message's header map built in
//     the loop: a bare client carrying the same information;
//   - sender: outboxnats.Sender.Send in batches of 500, without a database;
//   - relay: events committed to a PostgreSQL outbox, drained by a relay with the default
//     config (Run: batches of 500, two claim → send → delete loops), timed until Run has
//     returned with every batch written back;
//   - outbox-only: the same relay sending to a Sender that drops everything: the relay's
//     PostgreSQL side alone.
//
// b.N is the number of events each path sends; the paths take turns in rounds of 10,000
// events (benchtest.Rounds). Reported: events/s of each path, relay/bare and relay/bare-ce
// (DESIGN §11: relay/bare ≥ 0.5), and on Linux the CPU time per event of each path: the
// machine's busy time (broker, PostgreSQL and this process share the machine, so this is
// what bounds the rates), and that of this process, of nats-server, and of the relays'
// own PostgreSQL backends ("postgres"). Run it with a fixed count:
//
//	go test -run '^$' -bench BenchmarkJetStream -benchtime 50000x
func BenchmarkJetStream(b *testing.B) {
	_, js := connect(b)
	body := []byte(`{"order_id":"o-123456","note":"benchmark event"}`)
	typ := orderPlaced{}.EventType()
	fresh := func() *destination {
		return newDestination(b, js, outboxnats.Topology{}, outboxnats.SenderConfig{})
	}

	// publishAll publishes msgs asynchronously and waits for every ack.
	publishAll := func(msgs func(i int) *nats.Msg, n int) {
		for i := range n {
			if _, err := js.PublishMsgAsync(msgs(i)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("acks still missing after a minute")
		}
	}
	newIDs := func(n int) []string {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7()).String()
		}
		return ids
	}

	bare := func(d *destination, n int) func() {
		ids, subject := newIDs(n), d.prefix+"."+typ
		return func() {
			publishAll(func(i int) *nats.Msg {
				return &nats.Msg{Subject: subject, Data: body, Header: nats.Header{jetstream.MsgIDHeader: []string{ids[i]}}}
			}, n)
		}
	}
	ceDst := fresh()
	ceHeader := func(id, at, stream string) nats.Header {
		return nats.Header{
			"ce-specversion":               {"1.0"},
			"ce-id":                        {id},
			"ce-type":                      {typ},
			"ce-source":                    {"/txoutbox"},
			"ce-time":                      {at},
			"content-type":                 {"application/json"},
			jetstream.MsgIDHeader:          {id},
			jetstream.ExpectedStreamHeader: {stream},
		}
	}
	// The bare-ce loop must carry exactly what the Sender sends.
	probe := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: typ, ContentType: "application/json", Body: body, CreatedAt: time.Now().UTC()}
	nm, err := outboxnats.Encode(ceDst.sender, probe)
	if err != nil {
		b.Fatal(err)
	}
	if want := ceHeader(probe.ID.String(), probe.CreatedAt.Format(time.RFC3339Nano), streamName(ceDst)); !maps.EqualFunc(nm.Header, want, slices.Equal) {
		b.Fatalf("bare-ce headers %v, the Sender's %v", want, nm.Header)
	}
	bareCE := func(d *destination, n int) func() {
		ids, subject, stream := newIDs(n), d.prefix+"."+typ, streamName(d)
		at := make([]string, n)
		for i := range at {
			at[i] = time.Now().UTC().Format(time.RFC3339Nano)
		}
		return func() {
			publishAll(func(i int) *nats.Msg {
				return &nats.Msg{Subject: subject, Data: body, Header: ceHeader(ids[i], at[i], stream)}
			}, n)
		}
	}
	sender := func(d *destination, n int) func() {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: typ, ContentType: "application/json", Body: body, CreatedAt: time.Now().UTC()}
		}
		return func() {
			for start := 0; start < len(msgs); start += 500 {
				if err := d.sender.Send(context.Background(), msgs[start:min(start+500, len(msgs))]); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	// The relays' database sessions are told apart from others on the server, so that what
	// their backends spend can be measured.
	var backends []func() []int
	// relayPath drains an outbox of its own through s.
	relayPath := func(s outbox.Sender) func(_ *destination, n int) func() {
		o := pgxtest.New(b, "outboxnats")
		pool, pids := pgxtest.TaggedPool(b, 0)
		backends = append(backends, pids)
		store, err := o.NewStore(pool)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if left := o.Count(b, "outbox"); left != 0 {
				b.Errorf("%d events left in the outbox, want 0", left)
			}
		})
		prepare := benchtest.RelayPath(b, store, s, func(n int) {
			for start := 0; start < n; start += 1000 {
				events := make([]outbox.Encodable, 0, 1000)
				for range min(1000, n-start) {
					events = append(events, outbox.New(orderPlaced{OrderID: "o-123456", Note: "benchmark event"}))
				}
				o.Commit(b, events...)
			}
		})
		return func(_ *destination, n int) func() { return prepare(n) }
	}
	relayDst := fresh()
	relay, outboxOnly := relayPath(relayDst.sender), relayPath(benchtest.Discard{})
	relayBackends := func() []int {
		var all []int
		for _, pids := range backends {
			p := pids()
			if p == nil {
				return nil
			}
			all = append(all, p...)
		}
		return all
	}

	paths := []struct {
		name    string
		dst     *destination // nil: no stream
		prepare func(d *destination, n int) func()
	}{
		{"bare", fresh(), bare},
		{"bare-ce", ceDst, bareCE},
		{"sender", fresh(), sender},
		{"relay", relayDst, relay},
		{"outbox-only", nil, outboxOnly},
	}
	var rounds []*benchtest.Path
	for _, p := range paths {
		rounds = append(rounds, &benchtest.Path{Name: p.name, Prepare: func(n int) func() { return p.prepare(p.dst, n) }})
	}
	meters := []benchtest.Meter{benchtest.Processes("self"), benchtest.Processes("nats-server"), benchtest.PIDs("postgres", relayBackends)}
	rate := benchtest.Rounds(b, 10000, meters, rounds...)

	for _, p := range paths {
		if p.dst == nil {
			continue
		}
		if got := streamMsgs(b, p.dst.stream); got != uint64(b.N) {
			b.Fatalf("%s: the stream holds %d messages, want %d", p.name, got, b.N)
		}
	}
	b.ReportMetric(rate["relay"]/rate["bare"], "relay/bare")
	b.ReportMetric(rate["relay"]/rate["bare-ce"], "relay/bare-ce")
	b.ReportMetric(rate["sender"]/rate["bare"], "sender/bare")
	b.ReportMetric(rate["relay"]/rate["outbox-only"], "relay/outbox-only")
}

func streamName(d *destination) string { return d.stream.CachedInfo().Config.Name }
