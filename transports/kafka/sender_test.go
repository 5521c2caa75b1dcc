package outboxkafka_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

func message(typ, key, body string) outbox.Message {
	return outbox.Message{
		ID:          uuid.Must(uuid.NewV7()),
		Type:        typ,
		Key:         key,
		ContentType: "application/json",
		Body:        []byte(body),
		CreatedAt:   time.Now().UTC().Truncate(time.Microsecond),
	}
}

// failedAt returns the error of message i in a Send result that must be a BatchError.
func failedAt(t *testing.T, err error, i int) error {
	t.Helper()
	var be *outbox.BatchError
	if !errors.As(err, &be) || be.Failed[i] == nil {
		t.Fatalf("Send = %v, want a BatchError failing message %d", err, i)
	}
	return be.Failed[i]
}

// readRecords reads the first n records of topic, from every partition, without a group.
func readRecords(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, c, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records of %s: %v", len(out), n, topic, err)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func TestNewSenderReportsEveryProblem(t *testing.T) {
	c := newCluster(t)
	_, err := outboxkafka.NewSender(newClient(t, c, kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())), &outboxkafka.SenderConfig{
		Topic:           "bad topic",
		Routes:          map[string]string{"": "ok", "orders.created": strings.Repeat("x", 250)},
		MaxMessageBytes: -1,
	})
	if err == nil {
		t.Fatal("NewSender accepted an invalid config and an unsafe client")
	}
	for _, want := range []string{
		`Topic: topic name "bad topic" has ' '`, `Routes has an empty event type`, `Routes["orders.created"]`, `over Kafka's 249`,
		`MaxMessageBytes -1`, `kgo.DisableIdempotentWrite`, `kgo.RequiredAcks`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if _, err := outboxkafka.NewSender(newClient(t, c), nil); err == nil || !strings.Contains(err.Error(), "no event has a topic") {
		t.Errorf("NewSender(nil config) = %v", err)
	}
	if _, err := outboxkafka.NewSender(nil, &outboxkafka.SenderConfig{Topic: "t"}); err == nil {
		t.Error("NewSender(nil client) succeeded")
	}
}

// TestSenderWireFormat: a record carries the event in the CloudEvents Kafka binding's
// binary mode — "ce_" attribute headers, content-type, the key as record key, the payload
// as value — plus the dedup ID header; a replayed event gets its own dedup ID.
func TestSenderWireFormat(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	d := newDestination(t, c, nil)
	m := message("orders.created", "customer-7", `{"n":1}`)
	m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
	replayed := message("orders.created", "", `{"n":2}`)
	replayed.Headers = map[string]string{outbox.ReplayHeader: "42"}
	if err := d.sender.Send(context.Background(), []outbox.Message{m, replayed}); err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, c, d.topic, 2)
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		id, _ := header(r, "ce_id")
		byID[id] = r
	}
	r := byID[m.ID.String()]
	if r == nil {
		t.Fatalf("no record with ce_id %s among %d", m.ID, len(recs))
	}
	if string(r.Key) != m.Key || !bytes.Equal(r.Value, m.Body) {
		t.Errorf("record key %q value %q, want %q %q", r.Key, r.Value, m.Key, m.Body)
	}
	for k, want := range map[string]string{
		"ce_specversion":          "1.0",
		"ce_type":                 m.Type,
		"ce_source":               "/txoutbox",
		"ce_time":                 m.CreatedAt.Format(time.RFC3339Nano),
		"ce_partitionkey":         m.Key,
		"ce_traceparent":          m.Headers["traceparent"],
		"ce_txheaders":            `{"X-Tenant":"acme"}`,
		"content-type":            "application/json",
		outboxkafka.DedupIDHeader: m.ID.String(),
	} {
		if got, ok := header(r, k); !ok || got != want {
			t.Errorf("header %s = %q (present %v), want %q", k, got, ok, want)
		}
	}
	for _, h := range r.Headers {
		if strings.HasPrefix(h.Key, "ce-") {
			t.Errorf("header %s uses the HTTP prefix; the Kafka binding's is ce_", h.Key)
		}
	}
	rr := byID[replayed.ID.String()]
	if rr == nil {
		t.Fatal("the replayed event's record is missing")
	}
	if rr.Key != nil {
		t.Errorf("keyless event has record key %q, want none", rr.Key)
	}
	if got, _ := header(rr, outboxkafka.DedupIDHeader); got != replayed.DedupID() || got == replayed.ID.String() {
		t.Errorf("replayed event's dedup header %q, want %q", got, replayed.DedupID())
	}
}

// TestSenderPartitionsByKey: a key's records land in one partition, in the order they were
// sent; keyless records spread over several partitions.
func TestSenderPartitionsByKey(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	d := newDestination(t, c, nil)
	var keyed []outbox.Message
	for i := range 60 {
		keyed = append(keyed, message("orders.created", "customer-"+string(rune('a'+i%6)), `{}`))
	}
	for i := 0; i < len(keyed); i += 6 { // the relay sends a key's events one call at a time
		if err := d.sender.Send(context.Background(), keyed[i:i+6]); err != nil {
			t.Fatal(err)
		}
	}
	// Keyless: enough bytes for the sticky partitioner to move on several times.
	var keyless []outbox.Message
	for range 8 {
		batch := make([]outbox.Message, 40)
		for i := range batch {
			m := message("orders.created", "", "")
			m.ContentType = "application/octet-stream"
			m.Body = make([]byte, 1024)
			_, _ = rand.Read(m.Body)
			batch[i] = m
		}
		if err := d.sender.Send(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
		keyless = append(keyless, batch...)
	}
	recs := readRecords(t, c, d.topic, len(keyed)+len(keyless))
	partOf := map[string]int32{}
	lastOffset := map[string]int64{}
	keylessParts := map[int32]bool{}
	pos := map[string]int{}
	for i, m := range keyed {
		pos[m.ID.String()] = i
	}
	lastPos := map[string]int{}
	for _, r := range recs {
		if len(r.Key) == 0 {
			keylessParts[r.Partition] = true
			continue
		}
		k := string(r.Key)
		if p, ok := partOf[k]; ok && p != r.Partition {
			t.Errorf("key %s in partitions %d and %d", k, p, r.Partition)
		}
		partOf[k] = r.Partition
		id, _ := header(r, "ce_id")
		if o, ok := lastOffset[k]; ok && r.Offset < o || pos[id] < lastPos[k] {
			t.Errorf("key %s: record %s out of order", k, id)
		}
		lastOffset[k], lastPos[k] = r.Offset, pos[id]
	}
	if len(keylessParts) < 2 {
		t.Errorf("320 KiB of keyless records all went to partition(s) %v, want them spread", keylessParts)
	}
	t.Logf("keys over partitions %v; keyless records over %d partitions", partOf, len(keylessParts))
}

// TestSenderRoutes: event types go to their routes' topics, others to the default topic;
// without a default topic an unrouted type fails permanently.
func TestSenderRoutes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := newClient(t, c)
	orders, other := createTopic(t, cl, nil), createTopic(t, cl, nil)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: other, Routes: map[string]string{"orders.created": orders}})
	if err != nil {
		t.Fatal(err)
	}
	o, x := message("orders.created", "k", `{}`), message("users.created", "k", `{}`)
	if err := s.Send(context.Background(), []outbox.Message{o, x}); err != nil {
		t.Fatal(err)
	}
	if id, _ := header(readRecords(t, c, orders, 1)[0], "ce_id"); id != o.ID.String() {
		t.Errorf("topic %s holds %s, want %s", orders, id, o.ID)
	}
	if id, _ := header(readRecords(t, c, other, 1)[0], "ce_id"); id != x.ID.String() {
		t.Errorf("topic %s holds %s, want %s", other, id, x.ID)
	}

	strict, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Routes: map[string]string{"orders.created": orders}})
	if err != nil {
		t.Fatal(err)
	}
	err = failedAt(t, strict.Send(context.Background(), []outbox.Message{o, x}), 1)
	if !outbox.IsPermanent(err) || !strings.Contains(err.Error(), `no route for event type "users.created"`) {
		t.Errorf("unrouted type: %v, want a permanent error naming the type", err)
	}
}

// TestSenderSizeLimits: a record over the client's batch limit, the topic's
// max.message.bytes or the configured cap fails before it is produced, with
// outbox.ErrTooLarge and the limit's name; a record exactly at the topic's limit is
// accepted by the broker, so the sender counts bytes as Kafka does.
func TestSenderSizeLimits(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	// No compression: the broker measures the batch as sent, which is then what we count.
	cl := newClient(t, c, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerBatchMaxBytes(16<<10))
	limit := "4096"
	topic := createTopic(t, cl, map[string]*string{"max.message.bytes": &limit})
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	if got, name := s.MaxMessageBytes(context.Background(), topic); got != 4096 || !strings.Contains(name, "max.message.bytes") {
		t.Fatalf("MaxMessageBytes = %d (%s), want the topic's 4096", got, name)
	}
	// Find the body length whose record is exactly 4096 bytes.
	fit := message("blob", "", "")
	fit.ContentType = "application/octet-stream"
	fit.Body = make([]byte, 4096)
	over := func(err error) bool { return err != nil && errors.Is(err, outbox.ErrTooLarge) }
	for over(s.Send(context.Background(), []outbox.Message{fit})) {
		fit.Body = fit.Body[:len(fit.Body)-1]
		fit.ID = uuid.Must(uuid.NewV7()) // same header sizes, fresh event
	}
	// fit was accepted by the broker; one byte more is refused by the sender, and the
	// broker agrees when the same record is produced around the sender.
	big := fit
	big.ID = uuid.Must(uuid.NewV7())
	big.Body = make([]byte, len(fit.Body)+1)
	err = failedAt(t, s.Send(context.Background(), []outbox.Message{big}), 0)
	if !errors.Is(err, outbox.ErrTooLarge) || !strings.Contains(err.Error(), "topic "+topic+"'s max.message.bytes of 4096 bytes") {
		t.Errorf("one byte over: %v", err)
	}
	rec := outboxkafka.Encode(big, topic)
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); !errors.Is(err, kerr.MessageTooLarge) {
		t.Errorf("the broker took the record the sender refused (err %v): the sender's count is off", err)
	}
	if size := outboxkafka.RecordSize(rec); size != 4097 {
		t.Errorf("RecordSize = %d, want 4097", size)
	}

	// The client's limit, and the configured cap, name themselves.
	wide := createTopic(t, cl, nil)
	s2, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: wide})
	if err != nil {
		t.Fatal(err)
	}
	huge := message("blob", "", "")
	huge.Body = make([]byte, 20<<10)
	if err := failedAt(t, s2.Send(context.Background(), []outbox.Message{huge}), 0); !errors.Is(err, outbox.ErrTooLarge) || !strings.Contains(err.Error(), "kgo.ProducerBatchMaxBytes of 16384 bytes") {
		t.Errorf("over the client's limit: %v", err)
	}
	s3, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: wide, MaxMessageBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	huge.Body = make([]byte, 1000)
	if err := failedAt(t, s3.Send(context.Background(), []outbox.Message{huge}), 0); !errors.Is(err, outbox.ErrTooLarge) || !strings.Contains(err.Error(), "SenderConfig.MaxMessageBytes of 1000 bytes") {
		t.Errorf("over the configured cap: %v", err)
	}
}

// TestSenderBrokerRefusal: when the topic's limit shrinks after the sender read it, the
// broker's MESSAGE_TOO_LARGE comes back as outbox.ErrTooLarge, so the relay dead-letters
// the event instead of retrying it forever.
func TestSenderBrokerRefusal(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := newClient(t, c, kgo.ProducerBatchCompression(kgo.NoCompression()))
	topic := createTopic(t, cl, nil)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), []outbox.Message{message("x", "", `{}`)}); err != nil {
		t.Fatal(err) // the sender has read the topic's (default) limit
	}
	small := "2048"
	ctx := context.Background()
	resp, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &small}}, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	big := message("x", "", "")
	big.Body = make([]byte, 4096)
	ok := message("x", "", `{}`)
	// Both share a batch, which the broker refuses whole.
	err = s.Send(ctx, []outbox.Message{big, ok})
	if err := failedAt(t, err, 0); !errors.Is(err, outbox.ErrTooLarge) || !outbox.IsPermanent(err) ||
		!strings.Contains(err.Error(), "max.message.bytes of 2048 bytes") {
		t.Errorf("broker refusal: %v, want outbox.ErrTooLarge naming the topic's new limit", err)
	}
	var be *outbox.BatchError
	errors.As(err, &be)
	if e := be.Failed[1]; e != nil && outbox.IsPermanent(e) {
		t.Errorf("the small message of the refused batch failed permanently: %v", e)
	}
	// Sent again, as the relay does, the small message goes through.
	if err := s.Send(ctx, []outbox.Message{ok}); err != nil {
		t.Errorf("re-sending the small message: %v", err)
	}
}

// TestSendToMissingTopicIsUnavailable: a topic that does not exist (yet) fails the records
// as the cluster's fault (outbox.Unavailable: the relay waits for the topic, spending no
// attempt), once franz-go has given up on it, or once the send's context ends.
func TestSendToMissingTopicIsUnavailable(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := newClient(t, c)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: "outboxtest.missing." + unique()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e := failedAt(t, s.Send(ctx, []outbox.Message{message("x", "", `{}`)}), 0)
	if !outbox.IsUnavailable(e) || !errors.Is(e, kerr.UnknownTopicOrPartition) {
		t.Fatalf("error %v: want UNKNOWN_TOPIC_OR_PARTITION marked unavailable", e)
	}
}
