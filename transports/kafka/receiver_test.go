package outboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

func TestNewReceiverReportsEveryProblem(t *testing.T) {
	_, err := outboxkafka.NewReceiver(&outboxkafka.ReceiverConfig{
		Topics: []string{"ok", "not/ok"}, MaxWait: time.Millisecond, MaxPendingPerPartition: -1, RevokeTimeout: -1,
	})
	if err == nil {
		t.Fatal("NewReceiver accepted an invalid config")
	}
	for _, want := range []string{"Group is empty", `Topics[1]: topic name "not/ok"`, "MaxWait 1ms", "MaxPendingPerPartition -1", "RevokeTimeout -1ns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// onePartition returns a client of c, a fresh topic with one partition, and a sender to it.
func onePartition(t *testing.T, c *kfake.Cluster) (*kgo.Client, string, *outboxkafka.Sender) {
	t.Helper()
	cl := newClient(t, c)
	topic := createTopicN(t, cl, 1, nil)
	s, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	return cl, topic, s
}

// oneByOne sends msgs in separate calls, as the relay sends one key's events.
func oneByOne(t *testing.T, s outbox.Sender, msgs ...outbox.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := s.Send(context.Background(), []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
}

func receiveOne(t *testing.T, r outbox.Receiver) (outbox.Delivery, outbox.Message) {
	t.Helper()
	d := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	m, err := d.Message()
	if err != nil {
		t.Fatal(err)
	}
	return d, m
}

func ack(t *testing.T, d outbox.Delivery) {
	t.Helper()
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestNackHoldsItsKeyOnly: in one partition, a record being retried holds back the later
// records of its key until it succeeds, while another key's records flow.
func TestNackHoldsItsKeyOnly(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	_, topic, s := onePartition(t, c)
	a1, b1, a2, b2 := message("x", "A", `1`), message("x", "B", `1`), message("x", "A", `2`), message("x", "B", `2`)
	oneByOne(t, s, a1, b1, a2, b2)
	r := newReceiver(t, c, outboxkafka.ReceiverConfig{Topics: []string{topic}, MaxWait: 200 * time.Millisecond})

	ds := outboxtest.ReceiveN(t, r, 2, 10*time.Second)
	got := map[uuid.UUID]outbox.Delivery{}
	for _, d := range ds {
		m, _ := d.Message()
		got[m.ID] = d
	}
	if got[a1.ID] == nil || got[b1.ID] == nil {
		t.Fatalf("first deliveries %v, want A1 and B1 (the second record of each key waits)", got)
	}
	nackedAt := time.Now()
	if err := got[a1.ID].Nack(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	ack(t, got[b1.ID])
	if d, m := receiveOne(t, r); m.ID != b2.ID {
		t.Fatalf("while A1 waits, got %s, want B2", m.Body)
	} else {
		ack(t, d)
	}
	d, m := receiveOne(t, r)
	if m.ID != a1.ID || d.Attempt() != 2 {
		t.Fatalf("got %s attempt %d, want A1 attempt 2 (A2 must wait for it)", m.ID, d.Attempt())
	}
	if waited := time.Since(nackedAt); waited < 900*time.Millisecond {
		t.Errorf("A1 came back after %v, before its 1s delay", waited)
	}
	ack(t, d)
	if d, m := receiveOne(t, r); m.ID != a2.ID || d.Attempt() != 1 {
		t.Fatalf("got %s attempt %d, want A2 attempt 1", m.ID, d.Attempt())
	} else {
		ack(t, d)
	}
	if err := d.Ack(context.Background()); err == nil {
		t.Error("a second Ack of a settled delivery succeeded")
	}
	outboxtest.ExpectNone(t, r, 300*time.Millisecond)
}

// committed returns the group's committed offset for partition 0 of topic.
func committed(t *testing.T, cl *kgo.Client, group, topic string) int64 {
	t.Helper()
	offs, err := kadm.NewClient(cl).FetchOffsets(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offs.Lookup(topic, 0)
	if !ok {
		return -1
	}
	return o.At
}

// TestCommitsOnlyContiguousOffsets: records acked after a failed one do not move the
// group's offset past it; a new member of the group starts from the failed record, so it
// is retried, not skipped.
func TestCommitsOnlyContiguousOffsets(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl, topic, s := onePartition(t, c)
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, message("x", "", fmt.Sprint(i)))
	}
	oneByOne(t, s, msgs...)
	group := "group." + unique()
	cfg := outboxkafka.ReceiverConfig{Group: group, Topics: []string{topic}, MaxWait: 200 * time.Millisecond}
	r1 := newReceiver(t, c, cfg)
	for _, d := range outboxtest.ReceiveN(t, r1, 5, 10*time.Second) {
		m, _ := d.Message()
		if m.ID == msgs[2].ID {
			if err := d.Nack(context.Background(), time.Hour); err != nil {
				t.Fatal(err)
			}
			continue
		}
		ack(t, d)
	}
	outboxtest.ExpectNone(t, r1, 300*time.Millisecond) // lets Receive send its commit
	outboxtest.WaitFor(t, 10*time.Second, "offset 2 to be committed", func() bool {
		return committed(t, cl, group, topic) == 2
	})
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, cl, group, topic); got != 2 {
		t.Fatalf("after Close the group's offset is %d, want 2 (the failed record)", got)
	}

	r2 := newReceiver(t, c, cfg)
	for i := 2; i < 5; i++ {
		d, m := receiveOne(t, r2)
		if m.ID != msgs[i].ID {
			t.Fatalf("the group's new member got %s, want record %d", m.Body, i)
		}
		ack(t, d)
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, cl, group, topic); got != 5 {
		t.Errorf("group offset %d after all were acked, want 5", got)
	}
}

// TestMaxPendingPerPartitionPausesFetching: a key stuck in retries holds at most
// MaxPendingPerPartition records of its partition; the partition stops fetching, so a
// record far behind waits, and everything flows once the stuck record settles.
func TestMaxPendingPerPartitionPausesFetching(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	_, topic, s := onePartition(t, c)
	var stuck []outbox.Message
	for i := range 40 {
		stuck = append(stuck, message("x", "A", fmt.Sprint(i)))
	}
	if err := s.Send(context.Background(), stuck); err != nil {
		t.Fatal(err)
	}
	other := message("x", "B", `"far behind"`)
	oneByOne(t, s, other)
	r := newReceiver(t, c, outboxkafka.ReceiverConfig{Topics: []string{topic}, MaxWait: 200 * time.Millisecond, MaxPendingPerPartition: 5})
	d, m := receiveOne(t, r)
	if m.ID != stuck[0].ID {
		t.Fatalf("got %s, want the first A", m.Body)
	}
	if err := d.Nack(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	outboxtest.ExpectNone(t, r, 500*time.Millisecond) // B is beyond the held records
	d, m = receiveOne(t, r)
	if m.ID != stuck[0].ID {
		t.Fatalf("got %s, want the first A again", m.Body)
	}
	ack(t, d)
	seen := map[uuid.UUID]bool{}
	outboxtest.ReceiveEach(t, r, len(stuck), 10*time.Second, func(d outbox.Delivery) {
		m, _ := d.Message()
		seen[m.ID] = true
		ack(t, d)
	})
	if !seen[other.ID] {
		t.Error("the record behind the stuck key never came")
	}
}

// TestMalformedRecord: a record that is not a CloudEvent arrives as an
// *outbox.MalformedError with the raw headers and value and its topic/partition/offset.
func TestMalformedRecord(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := newClient(t, c)
	topic := createTopicN(t, cl, 1, nil)
	rec := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("not an event"), Headers: []kgo.RecordHeader{{Key: "ce_type", Value: []byte("orders.created")}}}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t, c, outboxkafka.ReceiverConfig{Topics: []string{topic}, MaxWait: 200 * time.Millisecond})
	d := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	_, err := d.Message()
	var me *outbox.MalformedError
	if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
		t.Fatalf("Message() = %v, want an *outbox.MalformedError", err)
	}
	if me.BrokerMessageID != topic+"/0/0" || string(me.Body) != "not an event" || me.Attributes["ce_type"] != "orders.created" ||
		me.Partial.Type != "orders.created" || me.Partial.Key != "k" {
		t.Errorf("MalformedError %+v", me)
	}
	ack(t, d)
}

// TestRebalanceLosesNothing: while the relay keeps producing, a second member joins the
// group, and later the first leaves; partitions move twice, and every record is handled,
// each key's records in order of their first handling.
func TestRebalanceLosesNothing(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	d := newDestination(t, c, nil)
	cfg := outboxkafka.ReceiverConfig{Group: "group." + unique(), Topics: []string{d.topic}, MaxWait: 100 * time.Millisecond}

	var (
		mu      sync.Mutex
		sent    []outbox.Message
		handled = map[uuid.UUID]int{}
		order   []outbox.Message
		by      = map[*outboxkafka.Receiver]int{}
	)
	consume := func(ctx context.Context, r *outboxkafka.Receiver) {
		for ctx.Err() == nil {
			ds, err := r.Receive(ctx, 10)
			if err != nil {
				return
			}
			for _, d := range ds {
				m, _ := d.Message()
				mu.Lock()
				if handled[m.ID] == 0 {
					order = append(order, m)
				}
				handled[m.ID]++
				by[r]++
				mu.Unlock()
				_ = d.Ack(context.Background()) // a record of a revoked partition may fail to ack: it comes again
			}
		}
	}
	handledBy := func(r *outboxkafka.Receiver) int {
		mu.Lock()
		defer mu.Unlock()
		return by[r]
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// The relay keeps sending, a batch with one event of each of 24 keys every 20ms.
	production, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	wg.Go(func() {
		for i := 0; production.Err() == nil; i++ {
			batch := make([]outbox.Message, 24)
			for k := range batch {
				batch[k] = message("x", fmt.Sprintf("key-%d", k), fmt.Sprint(i))
			}
			if err := d.sender.Send(context.Background(), batch); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			sent = append(sent, batch...)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	})

	r1 := newReceiver(t, c, cfg)
	ctx1, stop1 := context.WithCancel(context.Background())
	defer stop1()
	wg.Go(func() { consume(ctx1, r1) })
	outboxtest.WaitFor(t, 20*time.Second, "the first member to handle records", func() bool { return handledBy(r1) > 100 })

	r2 := newReceiver(t, c, cfg)
	ctx2, stop2 := context.WithCancel(context.Background())
	defer stop2()
	wg.Go(func() { consume(ctx2, r2) })
	outboxtest.WaitFor(t, 20*time.Second, "the second member to handle records", func() bool { return handledBy(r2) > 100 })

	stop1()
	if err := r1.Close(); err != nil {
		t.Error(err)
	}
	atClose := handledBy(r2)
	outboxtest.WaitFor(t, 20*time.Second, "the second member to go on alone", func() bool { return handledBy(r2) > atClose+200 })
	stopProducing()
	outboxtest.WaitFor(t, 30*time.Second, "every record sent to be handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == len(sent)
	})
	stop2()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, k := range handled {
		dups += k - 1
	}
	pos := map[uuid.UUID]int{}
	for i, m := range sent {
		pos[m.ID] = i
	}
	last := map[string]int{}
	for _, m := range order {
		if _, ok := pos[m.ID]; !ok {
			t.Fatalf("handled %s, which was never sent", m.ID)
		}
		if p, ok := last[m.Key]; ok && pos[m.ID] < p {
			t.Fatalf("key %s: record %s handled after a later one", m.Key, m.Body)
		}
		last[m.Key] = pos[m.ID]
	}
	t.Logf("%d records handled (first member %d, second %d), %d handled again after a rebalance", len(sent), by[r1], by[r2], dups)
}
