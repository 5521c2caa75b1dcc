package outboxkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/benchtest"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// BenchmarkKafka compares, in one run and against the same in-process cluster (kfake, three
// brokers, six-partition topics), the rate at which events reach a topic by three paths:
//
//   - bare: a plain franz-go produce loop of the records the Sender produces (same key,
//     value and headers: the CloudEvents attributes and the dedup ID, built in the loop),
//     then waiting for every acknowledgement;
//   - sender: outboxkafka.Sender.Send in batches of 500, without a database;
//   - relay: events committed to a PostgreSQL outbox, drained by a relay with the default
//     config (Run: batches of 500), timed until Run has returned with every batch written
//     back;
//   - outbox-only: the same relay sending to a Sender that discards: the PostgreSQL side's
//     own rate, which bounds the relay's (relay/outbox-only near 1 means Kafka is not the
//     bottleneck);
//   - relay-ordered: the relay of the same events into a Sender of its own declared an
//     outbox.KeyOrderer, so the relay sends each claim in one call instead of waves (one
//     event of each key per call), which the Kafka Sender does not declare (see the package
//     doc, Key order);
//   - outbox-keyless: the same again with keyless events, the fastest a relay drains this
//     outbox (relay/outbox-keyless: what 64 keys and Kafka cost together).
//
// b.N is the number of events each path sends, a key among 64 each (but outbox-keyless's). The paths take turns in
// rounds of 10,000 events, so load from elsewhere on the machine weighs on all of them
// alike. Reported: events/s of each path, relay/bare, sender/bare and relay/outbox-only, and on Linux the
// machine's busy CPU time per event of each path (the brokers, PostgreSQL and this process
// share the machine). Run it with a fixed count:
//
//	go test -run '^$' -bench BenchmarkKafka -benchtime 50000x
func BenchmarkKafka(b *testing.B) {
	c := newCluster(b)
	cl := newClient(b, c)
	body := []byte(`{"customer":"customer-17","seq":42}`)
	typ := orderPlaced{}.EventType()
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = "customer-" + uuid.NewString()[:8]
	}
	newSender := func(topic string) *outboxkafka.Sender {
		s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}

	// record builds, as a bare client would, the record the Sender produces.
	record := func(topic string, id uuid.UUID, key string, at time.Time) *kgo.Record {
		ids := id.String()
		return &kgo.Record{Topic: topic, Key: []byte(key), Value: body, Headers: []kgo.RecordHeader{
			{Key: "ce_specversion", Value: []byte("1.0")},
			{Key: "ce_id", Value: []byte(ids)},
			{Key: "ce_type", Value: []byte(typ)},
			{Key: "ce_source", Value: []byte("/txoutbox")},
			{Key: "ce_time", Value: []byte(at.Format(time.RFC3339Nano))},
			{Key: "content-type", Value: []byte("application/json")},
			{Key: "ce_partitionkey", Value: []byte(key)},
			{Key: outboxkafka.DedupIDHeader, Value: []byte(ids)},
		}}
	}
	// The bare loop must carry exactly what the Sender sends.
	probe := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: typ, Key: keys[0], ContentType: "application/json", Body: body, CreatedAt: time.Now().UTC()}
	if got, want := outboxkafka.Encode(probe, "t"), record("t", probe.ID, probe.Key, probe.CreatedAt); outboxkafka.RecordSize(got) != outboxkafka.RecordSize(want) || len(got.Headers) != len(want.Headers) {
		b.Fatalf("the bare record differs from the Sender's:\n%+v\n%+v", want, got)
	}

	bare := func(topic string, n int) func() {
		ids, at := make([]uuid.UUID, n), make([]time.Time, n)
		for i := range ids {
			ids[i], at[i] = uuid.Must(uuid.NewV7()), time.Now().UTC()
		}
		return func() {
			errs := make(chan error, n)
			for i := range n {
				cl.Produce(context.Background(), record(topic, ids[i], keys[i%len(keys)], at[i]), func(_ *kgo.Record, err error) { errs <- err })
			}
			for range n {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	senders := map[string]*outboxkafka.Sender{}
	sender := func(topic string, n int) func() {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: typ, Key: keys[i%len(keys)], ContentType: "application/json", Body: body, CreatedAt: time.Now().UTC()}
		}
		return func() {
			for start := 0; start < len(msgs); start += 500 {
				if err := senders[topic].Send(context.Background(), msgs[start:min(start+500, len(msgs))]); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	// relayPath drains an outbox of its own through s.
	relayPath := func(s outbox.Sender, keyed bool) func(string, int) func() {
		pg := pgxtest.New(b, "outboxkafka")
		b.Cleanup(func() {
			if left := pg.Count(b, "outbox"); left != 0 {
				b.Errorf("%d events left in the outbox, want 0", left)
			}
		})
		relay := benchtest.RelayPath(b, pg.Store(b), s, func(n int) {
			for start := 0; start < n; start += 1000 {
				events := make([]outbox.Encodable, 0, 1000)
				for i := range min(1000, n-start) {
					key := keys[(start+i)%len(keys)]
					var opts []outbox.Option
					if keyed {
						opts = append(opts, outbox.WithKey(key))
					}
					events = append(events, outbox.New(orderPlaced{Customer: key, Seq: 42}, opts...))
				}
				pg.Commit(b, events...)
			}
		})
		return func(_ string, n int) func() { return relay(n) }
	}

	senderTopic, relayTopic, orderedTopic := createTopic(b, cl, nil), createTopic(b, cl, nil), createTopic(b, cl, nil)
	senders[senderTopic] = newSender(senderTopic)
	paths := []struct {
		name    string
		topic   string                           // "" for none
		prepare func(topic string, n int) func() // readies n events untimed, returns the timed part
	}{
		{"bare", createTopic(b, cl, nil), bare},
		{"sender", senderTopic, sender},
		{"relay", relayTopic, relayPath(newSender(relayTopic), true)},
		{"relay-ordered", orderedTopic, relayPath(ordered{newSender(orderedTopic)}, true)},
		{"outbox-only", "", relayPath(benchtest.Discard{}, true)},
		{"outbox-keyless", "", relayPath(benchtest.Discard{}, false)},
	}
	var rounds []*benchtest.Path
	for _, p := range paths {
		rounds = append(rounds, &benchtest.Path{Name: p.name, Prepare: func(n int) func() { return p.prepare(p.topic, n) }})
	}
	rate := benchtest.Rounds(b, 10000, nil, rounds...)

	adm := kadm.NewClient(cl)
	for _, p := range paths {
		if p.topic == "" {
			continue
		}
		ends, err := adm.ListEndOffsets(context.Background(), p.topic)
		if err != nil {
			b.Fatal(err)
		}
		var total int64
		ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
		if total != int64(b.N) {
			b.Fatalf("%s: the topic holds %d records, want %d", p.name, total, b.N)
		}
	}
	b.ReportMetric(rate["relay"]/rate["bare"], "relay/bare")
	b.ReportMetric(rate["sender"]/rate["bare"], "sender/bare")
	b.ReportMetric(rate["relay"]/rate["outbox-only"], "relay/outbox-only")
	b.ReportMetric(rate["relay"]/rate["outbox-keyless"], "relay/outbox-keyless")
	b.ReportMetric(rate["relay-ordered"]/rate["relay"], "relay-ordered/relay")
}

// ordered declares a Sender an outbox.KeyOrderer: the relay sends it a claim in one call.
type ordered struct{ outbox.Sender }

func (ordered) KeepsKeyOrder() bool { return true }
