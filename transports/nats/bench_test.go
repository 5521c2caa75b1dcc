package outboxnats_test

import (
	"context"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// BenchmarkJetStream compares, in one run and against the same server, the rate at which
// events reach a JetStream stream (file storage) by four paths:
//
//   - bare: a plain nats.go async-publish loop (body and Nats-Msg-Id), then waiting for all
//     acks: the broker's own publish rate from a client;
//   - bare-ce: the same loop sending the headers the Sender sends (the CloudEvents
//     attributes, Nats-Msg-Id, Nats-Expected-Stream), each message's header map built in
//     the loop: a bare client carrying the same information;
//   - sender: outboxnats.Sender.Send in batches of 500, without a database;
//   - relay: events committed to a PostgreSQL outbox, drained by a relay with the default
//     config (Run: batches of 500, two claim → send → delete loops), timed until Run has
//     returned with every batch written back.
//
// b.N is the number of events each path sends. The paths take turns in rounds of 10,000
// events, so load from elsewhere on the machine weighs on all of them alike. Reported:
// events/s of each path, relay/bare and relay/bare-ce (DESIGN §11: relay/bare ≥ 0.5), and on
// Linux the machine's busy CPU time per event of each path (broker, PostgreSQL and this
// process share the machine, so this is what bounds the rates). Run it with a fixed count:
//
//	go test -run '^$' -bench BenchmarkJetStream -benchtime 50000x
func BenchmarkJetStream(b *testing.B) {
	_, js := connect(b)
	body := []byte(`{"order_id":"o-123456","note":"benchmark event"}`)
	typ := orderPlaced{}.EventType()
	fresh := func() *destination {
		return newDestination(b, js, outboxnats.Topology{}, outboxnats.SenderConfig{})
	}

	type path struct {
		name string
		dst  *destination
		// prepare readies n events untimed and returns the timed part.
		prepare func(d *destination, n int) func()
		spent   time.Duration
		cpu     int64 // busy jiffies, -1 when unknown
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
	pg := pgxtest.New(b, "outboxnats")
	relayDst := fresh()
	sink := &countingSender{Sender: relayDst.sender}
	relay := quietRelay(b, pg, sink, outbox.RelayConfig{})
	relayPath := func(_ *destination, n int) func() {
		for start := 0; start < n; start += 1000 {
			events := make([]outbox.Encodable, 0, 1000)
			for range min(1000, n-start) {
				events = append(events, outbox.New(orderPlaced{OrderID: "o-123456", Note: "benchmark event"}))
			}
			pg.Commit(b, events...)
		}
		return func() {
			sent := sink.expect(n)
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() { defer close(ran); _ = relay.Run(ctx) }()
			select {
			case <-sent:
			case <-time.After(time.Minute):
				b.Error("the relay did not send every event within a minute")
			}
			cancel()
			<-ran
		}
	}

	paths := []*path{
		{name: "bare", dst: fresh(), prepare: bare},
		{name: "bare-ce", dst: ceDst, prepare: bareCE},
		{name: "sender", dst: fresh(), prepare: sender},
		{name: "relay", dst: relayDst, prepare: relayPath},
	}
	const round = 10000
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		for _, p := range paths {
			run := p.prepare(p.dst, n)
			cpu0 := busyJiffies()
			start := time.Now()
			run()
			p.spent += time.Since(start)
			if cpu1 := busyJiffies(); cpu0 < 0 || cpu1 < 0 || p.cpu < 0 {
				p.cpu = -1
			} else {
				p.cpu += cpu1 - cpu0
			}
		}
	}
	b.StopTimer()

	for _, p := range paths {
		if got := streamMsgs(b, p.dst.stream); got != uint64(b.N) {
			b.Fatalf("%s: the stream holds %d messages, want %d", p.name, got, b.N)
		}
	}
	if left := pg.Count(b, "outbox"); left != 0 {
		b.Fatalf("%d events left in the outbox, want 0", left)
	}
	rate := map[string]float64{}
	b.ReportMetric(0, "ns/op")
	for _, p := range paths {
		rate[p.name] = float64(b.N) / p.spent.Seconds()
		b.ReportMetric(rate[p.name], p.name+"-ev/s")
		if p.cpu >= 0 {
			b.ReportMetric(float64(p.cpu)*1e6/float64(clockTicks)/float64(b.N), p.name+"-cpu-µs/ev")
		}
	}
	b.ReportMetric(rate["relay"]/rate["bare"], "relay/bare")
	b.ReportMetric(rate["relay"]/rate["bare-ce"], "relay/bare-ce")
	b.ReportMetric(rate["sender"]/rate["bare"], "sender/bare")
}

func streamName(d *destination) string { return d.stream.CachedInfo().Config.Name }

// countingSender passes sends on and signals once the expected number of messages went
// through without error.
type countingSender struct {
	outbox.Sender
	mu   sync.Mutex
	left int
	done chan struct{}
}

// expect arms the counter for n messages and returns the channel closed when they are sent.
func (c *countingSender) expect(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left, c.done = n, make(chan struct{})
	return c.done
}

func (c *countingSender) Send(ctx context.Context, msgs []outbox.Message) error {
	err := c.Sender.Send(ctx, msgs)
	if err == nil {
		c.mu.Lock()
		if c.left -= len(msgs); c.left <= 0 && c.done != nil {
			close(c.done)
			c.done = nil
		}
		c.mu.Unlock()
	}
	return err
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux platform Go supports.
const clockTicks = 100

// busyJiffies returns the machine's non-idle CPU time from /proc/stat, or -1 off Linux.
func busyJiffies() int64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return -1
	}
	if len(fields) > 9 {
		fields = fields[:9] // guest time is counted in user time already
	}
	var busy int64
	for i, f := range fields[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return -1
		}
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy
}
