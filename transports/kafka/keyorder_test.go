package outboxkafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// checkKeyOrder checks the promise of outbox.KeyOrderer on one Send's result: for every key,
// its messages' outcomes are deliveries, then failures only. It returns the indexes that
// were delivered and whether some key failed after a delivery (in the middle of its run).
func checkKeyOrder(t *testing.T, msgs []outbox.Message, err error) (delivered map[int]bool, midKey bool) {
	t.Helper()
	var be *outbox.BatchError
	if err != nil && !errors.As(err, &be) {
		t.Fatalf("Send = %v, want nil or a BatchError", err)
	}
	delivered = map[int]bool{}
	firstFailure := map[string]int{}
	for i, m := range msgs {
		if be != nil && be.Failed[i] != nil {
			if _, ok := firstFailure[m.Key]; !ok {
				firstFailure[m.Key] = i
				for j := range i {
					if msgs[j].Key == m.Key && delivered[j] {
						midKey = true
						break
					}
				}
			}
			continue
		}
		if f, ok := firstFailure[m.Key]; ok && m.Key != "" {
			t.Errorf("key %s: message %d delivered after message %d failed", m.Key, i, f)
		}
		delivered[i] = true
	}
	return delivered, midKey
}

// topicRecords reads every record of topic (its end offsets say how many) and returns, for
// each key, the ce_id headers in partition order.
func topicRecords(t *testing.T, c *kfake.Cluster, cl *kgo.Client, topic string) (map[string][]string, int) {
	t.Helper()
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	byKey := map[string][]string{}
	if total == 0 {
		return byKey, 0
	}
	recs := readRecords(t, c, topic, int(total))
	for _, r := range recs {
		id, _ := header(r, "ce_id")
		byKey[string(r.Key)] = append(byKey[string(r.Key)], id)
	}
	return byKey, len(recs)
}

// invalidRecord answers a produce request as a broker refusing every batch in it with
// INVALID_RECORD, an error franz-go does not retry.
func invalidRecord(req *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.Version = req.Version
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, p := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode, sp.BaseOffset = p.Partition, kerr.InvalidRecord.Code, -1
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// keyedRun returns keys × perKey messages, the keys interleaved as a claim of several keys
// is, with bodies of size bytes.
func keyedRun(keys, perKey, size int) []outbox.Message {
	var msgs []outbox.Message
	for i := range keys * perKey {
		m := message("orders.created", fmt.Sprintf("customer-%d", i%keys), "")
		m.Body = []byte(`"` + strings.Repeat("x", size) + `"`)
		msgs = append(msgs, m)
	}
	return msgs
}

// TestSenderKeepsKeyOrderThroughABrokerFailure: the broker fails a produce request in the
// middle of a Send of interleaved runs of 8 keys (a non-retriable INVALID_RECORD on the
// second request that carries a partition). Every key's messages are delivered, then
// failed (by the broker, or unsent after it), never a delivery after a failure; the topic
// holds exactly the delivered ones, in order; and when
// the failed ones are sent again, as the relay does, every key's records are its messages
// in order, each once.
func TestSenderKeepsKeyOrderThroughABrokerFailure(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	// Small batches: a key's run spans several batches of its partition.
	cl := newClient(t, c, kgo.ProducerBatchMaxBytes(2048), kgo.ProducerBatchCompression(kgo.NoCompression()))
	topic := createTopic(t, cl, nil)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	details, err := kadm.NewClient(cl).ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	topicID := details[topic].ID

	var mu sync.Mutex
	requests := map[int32]int{} // partition → produce requests that carried a batch of it
	var failedParts []int32
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		req := kreq.(*kmsg.ProduceRequest)
		second := false
		for _, rt := range req.Topics {
			if rt.Topic != topic && rt.TopicID != topicID {
				continue
			}
			for _, p := range rt.Partitions {
				requests[p.Partition]++
				second = second || requests[p.Partition] == 2
			}
		}
		if !second || failedParts != nil {
			return nil, nil, false
		}
		for _, rt := range req.Topics {
			for _, p := range rt.Partitions {
				failedParts = append(failedParts, p.Partition)
			}
		}
		return invalidRecord(req), nil, true
	})

	msgs := keyedRun(8, 40, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sendErr := s.Send(ctx, msgs)
	mu.Lock()
	parts := failedParts
	mu.Unlock()
	if parts == nil {
		t.Fatalf("no produce request was failed (Send: %v)", sendErr)
	}
	delivered, midKey := checkKeyOrder(t, msgs, sendErr)
	if !midKey {
		t.Fatal("no key failed in the middle of its run: the failure did not test the promise")
	}
	var be *outbox.BatchError
	errors.As(sendErr, &be)
	refused := 0
	for i, err := range be.Failed {
		switch {
		case errors.Is(err, kerr.InvalidRecord):
			refused++
		case !strings.Contains(err.Error(), "not sent: message"):
			t.Errorf("message %d: %v, want the broker's INVALID_RECORD or not sent after one of its key failed", i, err)
		}
	}
	if refused == 0 {
		t.Error("no message failed with the broker's INVALID_RECORD")
	}
	t.Logf("failed partitions %v: %d of %d messages delivered", parts, len(delivered), len(msgs))

	// The topic holds the delivered messages, and only those, in each key's order.
	want := map[string][]string{}
	for i, m := range msgs {
		if delivered[i] {
			want[m.Key] = append(want[m.Key], m.ID.String())
		}
	}
	got, n := topicRecords(t, c, cl, topic)
	if n != len(delivered) {
		t.Errorf("the topic holds %d records, want the %d delivered", n, len(delivered))
	}
	for k, ids := range want {
		if !slices.Equal(got[k], ids) {
			t.Errorf("key %s: the topic holds %v, want %v", k, got[k], ids)
		}
	}

	// Sent again, as the relay does: each key's records are its messages, in order, once.
	var again []outbox.Message
	for i, m := range msgs {
		if !delivered[i] {
			again = append(again, m)
		}
	}
	if err := s.Send(ctx, again); err != nil {
		t.Fatalf("sending the failed messages again: %v", err)
	}
	all := map[string][]string{}
	for _, m := range msgs {
		all[m.Key] = append(all[m.Key], m.ID.String())
	}
	got, n = topicRecords(t, c, cl, topic)
	if n != len(msgs) {
		t.Errorf("the topic holds %d records, want %d", n, len(msgs))
	}
	for k, ids := range all {
		if !slices.Equal(got[k], ids) {
			t.Errorf("key %s after the resend: the topic holds %v, want %v", k, got[k], ids)
		}
	}
}

// TestSenderFailsTheRestOfAKeyUnsent: a message that fails before it is produced (over the
// size limit, or with no route) fails the later messages of its key in the call, unsent;
// the earlier ones and the other keys are delivered.
func TestSenderFailsTheRestOfAKeyUnsent(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := newClient(t, c)
	topic := createTopic(t, cl, nil)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic, MaxMessageBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	msgs := keyedRun(3, 4, 10)                                   // keys 0 1 2 0 1 2 …
	msgs[3].Body = []byte(`"` + strings.Repeat("x", 2000) + `"`) // key 0's second: too large
	strict, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Routes: map[string]string{"orders.created": topic}})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Send(context.Background(), msgs)
	delivered, _ := checkKeyOrder(t, msgs, err)
	if e := failedAt(t, err, 3); !errors.Is(e, outbox.ErrTooLarge) {
		t.Errorf("message 3: %v, want outbox.ErrTooLarge", e)
	}
	for _, i := range []int{6, 9} {
		if e := failedAt(t, err, i); errors.Is(e, outbox.ErrTooLarge) || !strings.Contains(e.Error(), "not sent") {
			t.Errorf("message %d (key 0, after the failed one): %v, want not sent", i, e)
		}
	}
	if len(delivered) != 9 {
		t.Errorf("%d messages delivered, want 9 (key 0's first, keys 1 and 2)", len(delivered))
	}

	// No route for key 1's third message (strict has no default topic).
	msgs2 := keyedRun(2, 4, 10)
	msgs2[5].Type = "users.created"
	err = strict.Send(context.Background(), msgs2)
	delivered2, _ := checkKeyOrder(t, msgs2, err)
	if e := failedAt(t, err, 5); !outbox.IsPermanent(e) {
		t.Errorf("message 5: %v, want a permanent error", e)
	}
	if e := failedAt(t, err, 7); !strings.Contains(e.Error(), "not sent") {
		t.Errorf("message 7: %v, want not sent", e)
	}
	if len(delivered2) != 6 {
		t.Errorf("%d messages delivered, want 6", len(delivered2))
	}

	got, n := topicRecords(t, c, cl, topic)
	if n != len(delivered)+len(delivered2) {
		t.Errorf("the topic holds %d records, want the %d delivered", n, len(delivered)+len(delivered2))
	}
	want := map[string][]string{}
	for i, m := range msgs {
		if delivered[i] {
			want[m.Key] = append(want[m.Key], m.ID.String())
		}
	}
	for i, m := range msgs2 {
		if delivered2[i] {
			want[m.Key] = append(want[m.Key], m.ID.String())
		}
	}
	for k, ids := range want {
		if !slices.Equal(got[k], ids) {
			t.Errorf("key %s: the topic holds %v, want %v", k, got[k], ids)
		}
	}
}

// keyCalls is a Sender wrapper that declares outbox.KeyOrderer, so the relay gives it a claim
// in one call, and notes whether it ever got several messages of one key in one call.
type keyCalls struct {
	outbox.Sender
	mu       sync.Mutex
	multiKey bool
}

func (k *keyCalls) Send(ctx context.Context, msgs []outbox.Message) error {
	seen := map[string]bool{}
	for _, m := range msgs {
		if seen[m.Key] {
			k.mu.Lock()
			k.multiKey = true
			k.mu.Unlock()
			break
		}
		seen[m.Key] = true
	}
	return k.Sender.Send(ctx, msgs)
}

func (k *keyCalls) KeepsKeyOrder() bool { return true }

// TestRelayKeepsKeyOrderThroughBrokerFailures: a relay drains 8 customers' orders (40 each)
// through the Kafka Sender declared a KeyOrderer (so it gets a claim's runs of a key in one
// call), while the broker fails one produce request in three (INVALID_RECORD, five times).
// Every order reaches the topic exactly once, and each customer's orders are in the topic in
// commit order. (Before the Sender chained a key's records, franz-go wrote a record
// produced just after its key's failed batch: order #1 landed before #0.)
func TestRelayKeepsKeyOrderThroughBrokerFailures(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := newClient(t, c, kgo.ProducerBatchMaxBytes(4096), kgo.ProducerBatchCompression(kgo.NoCompression()))
	topic := createTopic(t, cl, nil)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	requests, failures := 0, 0
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		requests++
		if requests%3 != 2 || failures == 5 {
			return nil, nil, false
		}
		failures++
		return invalidRecord(kreq.(*kmsg.ProduceRequest)), nil, true
	})

	pl := newPipeline(t)
	customers := make([]string, 8)
	for i := range customers {
		customers[i] = fmt.Sprintf("customer-%d", i)
	}
	for range 40 {
		pl.commit(customers...)
	}
	sender := &keyCalls{Sender: s}
	stop := run(t, pl.relay("ordered", sender).Run)
	outboxtest.WaitFor(t, 60*time.Second, "the outbox to drain", func() bool { return pl.p.Count(t, "outbox") == 0 })
	stop()
	mu.Lock()
	failed := failures
	mu.Unlock()
	if failed == 0 {
		t.Fatal("the broker failed no produce request")
	}
	sender.mu.Lock()
	multiKey := sender.multiKey
	sender.mu.Unlock()
	if !multiKey {
		t.Error("the relay never sent two messages of one key in one call: it sent in waves")
	}
	if n := pl.p.Count(t, "outbox_dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}

	recs := readRecords(t, c, topic, 8*40)
	next := map[string]int{}
	for _, r := range recs {
		var o orderPlaced
		if err := json.Unmarshal(r.Value, &o); err != nil {
			t.Fatal(err)
		}
		if o.Seq != next[o.Customer] {
			t.Errorf("customer %s: order #%d in the topic where #%d was due", o.Customer, o.Seq, next[o.Customer])
		}
		next[o.Customer] = o.Seq + 1
	}
	got, n := topicRecords(t, c, cl, topic)
	if n != 8*40 || len(got) != 8 {
		t.Errorf("the topic holds %d records of %d keys, want %d of 8", n, len(got), 8*40)
	}
	t.Logf("%d produce requests failed; every customer's 40 orders in the topic once, in order", failed)
}
