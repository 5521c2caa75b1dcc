package outboxsqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

type OrderCompleted struct {
	Order string
	Seq   int
}

func (OrderCompleted) EventType() string { return "orders.completed" }

type BlobUploaded struct{ Data string }

func (BlobUploaded) EventType() string { return "blobs.uploaded" }

// startRelay runs a relay until the test ends.
func startRelay(t testing.TB, store outboxdriver.Store, s outbox.Sender, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(store, s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return r
}

// Every committed event goes PostgreSQL → relay → SQS → receiver with its ID, key, headers
// and payload; a rolled-back one never does.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	p := pgxtest.New(t, "outboxsqs")
	url := newQueue(t, c, false)
	ctx := context.Background()

	want := map[uuid.UUID]outbox.Event[OrderCompleted]{}
	for i := range 10 { // one event per transaction: the single-row INSERT path
		e := outbox.New(OrderCompleted{Order: fmt.Sprint("o-", i%5), Seq: i}, outbox.WithKey(fmt.Sprint("o-", i%5)),
			outbox.WithHeader("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
		want[e.ID] = e
		p.Commit(t, e)
	}
	var many []outbox.Encodable // 40 in one transaction: the COPY path
	for i := range 40 {
		e := outbox.New(OrderCompleted{Order: "bulk", Seq: i}, outbox.WithHeader("X-Tenant", "acme"))
		want[e.ID] = e
		many = append(many, e)
	}
	p.Commit(t, many...)

	rolledBack := outbox.New(OrderCompleted{Order: "never", Seq: -1})
	tx, err := p.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Outbox.Publish(ctx, tx, rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	startRelay(t, p.Store(t), s, relay.Config{})
	r := newReceiver(t, c, url)
	for _, d := range outboxtest.ReceiveN(t, r, len(want), 20*time.Second) {
		m, err := d.Message()
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[m.ID]
		if !ok {
			t.Fatalf("received %s (%s), which was not committed (rolled back: %s)", m.ID, m.Body, rolledBack.ID)
		}
		delete(want, m.ID)
		got, err := outbox.Decode[OrderCompleted](m)
		if err != nil {
			t.Fatal(err)
		}
		if got.Payload != w.Payload || got.Key != w.Key || !got.CreatedAt.Equal(w.CreatedAt.Truncate(time.Microsecond)) {
			t.Errorf("event %s: got %+v, want %+v", m.ID, got, w)
		}
		for k, v := range w.Headers {
			if got.Headers[k] != v {
				t.Errorf("event %s: header %s = %q, want %q", m.ID, k, got.Headers[k], v)
			}
		}
		if d.Attempt() != 1 {
			t.Errorf("event %s: attempt %d, want 1", m.ID, d.Attempt())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.WaitFor(t, 10*time.Second, "outbox drained", func() bool { return p.Count(t, "outbox") == 0 })
	if n := p.Count(t, "outbox_dead_letters"); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	outboxtest.ExpectNone(t, r, time.Second) // no duplicate, and never the rolled-back event
}

// Through the relay into a FIFO queue, each key's events arrive in the order they were
// written, with two relays sharing the outbox and small batches.
func TestFIFOPerKeyOrderThroughRelay(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	p := pgxtest.New(t, "outboxsqs")
	url := newQueue(t, c, true)
	const keys, perKey = 5, 20
	for i := range perKey {
		var tx []outbox.Encodable
		for k := range keys {
			key := fmt.Sprint("account-", k)
			tx = append(tx, outbox.New(OrderCompleted{Order: key, Seq: i}, outbox.WithKey(key)))
		}
		tx = append(tx, outbox.New(OrderCompleted{Order: "", Seq: i})) // keyless: unordered
		p.Commit(t, tx...)
	}
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	store := p.Store(t)
	startRelay(t, store, s, relay.Config{Name: "relay-a", BatchSize: 7})
	startRelay(t, store, s, relay.Config{Name: "relay-b", BatchSize: 7})

	r := newReceiver(t, c, url)
	next := map[string]int{}
	keyless := 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for received := 0; received < keys*perKey+perKey; {
		ds, err := r.Receive(ctx, 10)
		if err != nil {
			t.Fatalf("after %d of %d events: %v", received, keys*perKey+perKey, err)
		}
		for _, d := range ds {
			m, err := d.Message()
			if err != nil {
				t.Fatal(err)
			}
			e, err := outbox.Decode[OrderCompleted](m)
			if err != nil {
				t.Fatal(err)
			}
			if e.Key == "" {
				keyless++
			} else if e.Payload.Seq != next[e.Key] {
				t.Fatalf("key %s: received event %d, want %d (out of order)", e.Key, e.Payload.Seq, next[e.Key])
			} else {
				next[e.Key]++
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			received++
		}
	}
	for k := range keys {
		if key := fmt.Sprint("account-", k); next[key] != perKey {
			t.Errorf("key %s: %d events, want %d", key, next[key], perKey)
		}
	}
	if keyless != perKey {
		t.Errorf("%d keyless events, want %d", keyless, perKey)
	}
	outboxtest.ExpectNone(t, r, time.Second)
}

// An event sent twice to a FIFO queue (a relay re-sending after a crash between send and
// delete) is received once: the event ID is the MessageDeduplicationId.
func TestFIFODedupOfResentEvent(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	url := newQueue(t, c, true)
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	m := message("orders.completed", "order-1", `{"n":1}`)
	other := message("orders.completed", "order-2", `{"n":2}`)
	ctx := context.Background()
	if err := s.Send(ctx, []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(ctx, []outbox.Message{m, other}); err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t, c, url)
	if got := receiveIDs(t, r, 2); got[m.ID] != 1 || got[other.ID] != 1 {
		t.Fatalf("received %v, want %s and %s once each", got, m.ID, other.ID)
	}
	outboxtest.ExpectNone(t, r, time.Second)
}

// failFirstComplete is a Store whose first Complete fails after the send: the relay's crash
// between sending and deleting.
type failFirstComplete struct {
	outboxdriver.Store
	calls atomic.Int32
}

func (s *failFirstComplete) Complete(ctx context.Context, token int64, seqs []int64) error {
	if s.calls.Add(1) == 1 {
		return fmt.Errorf("injected: relay lost its connection after sending %d message(s)", len(seqs))
	}
	return s.Store.Complete(ctx, token, seqs)
}

// The same through the relay: the claim is not completed, its lease expires, another claim
// sends the event again, and the queue keeps one copy.
func TestFIFODedupThroughRelayResend(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	p := pgxtest.New(t, "outboxsqs")
	url := newQueue(t, c, true)
	e := outbox.New(OrderCompleted{Order: "o-1", Seq: 1}, outbox.WithKey("o-1"))
	p.Commit(t, e)
	store := &failFirstComplete{Store: p.Store(t)}
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	startRelay(t, store, s, relay.Config{Lease: time.Second, SendTimeout: 400 * time.Millisecond})
	outboxtest.WaitFor(t, 15*time.Second, "event sent twice and completed", func() bool {
		return store.calls.Load() >= 2 && p.Count(t, "outbox") == 0
	})
	r := newReceiver(t, c, url)
	if got := receiveIDs(t, r, 1); got[e.ID] != 1 {
		t.Fatalf("received %v, want %s", got, e.ID)
	}
	outboxtest.ExpectNone(t, r, time.Second)
}

// An event over the SQS limit is dead-lettered by the relay on its first attempt, with the
// limit in the reason; the rest of its batch is delivered.
func TestOversizeEventDeadLettered(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	p := pgxtest.New(t, "outboxsqs")
	url := newQueue(t, c, false)
	big := outbox.New(BlobUploaded{Data: strings.Repeat("x", 300<<10)})
	small := []outbox.Event[OrderCompleted]{
		outbox.New(OrderCompleted{Order: "a", Seq: 1}),
		outbox.New(OrderCompleted{Order: "b", Seq: 2}, outbox.WithKey("b")),
		outbox.New(OrderCompleted{Order: "c", Seq: 3}),
	}
	p.Commit(t, small[0], big, small[1], small[2])

	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	relay, err := relay.New(p.Store(t), s, &relay.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if n, err := relay.RunOnce(ctx); err != nil || n != 4 {
		t.Fatalf("RunOnce = %d, %v; want 4 claimed", n, err)
	}

	rows, err := p.Pool.Query(ctx, "SELECT event_id, reason, attempts, stage FROM "+p.Schema+".outbox_dead_letters")
	if err != nil {
		t.Fatal(err)
	}
	type dead struct {
		id       uuid.UUID
		reason   string
		attempts int
		stage    string
	}
	var got []dead
	for rows.Next() {
		var d dead
		if err := rows.Scan(&d.id, &d.reason, &d.attempts, &d.stage); err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].id != big.ID || got[0].attempts != 1 || got[0].stage != "relay" ||
		!strings.Contains(got[0].reason, "over the SQS limit of 256 KiB") {
		t.Fatalf("dead letters %+v, want only %s, attempts 1, stage relay, reason naming the 256 KiB limit", got, big.ID)
	}
	t.Logf("dead letter reason: %s", got[0].reason)
	if n := p.Count(t, "outbox"); n != 0 {
		t.Fatalf("%d events left in the outbox, want 0", n)
	}
	r := newReceiver(t, c, url)
	ids := receiveIDs(t, r, len(small))
	for _, e := range small {
		if ids[e.ID] != 1 {
			t.Fatalf("received %v, want each of the small events once", ids)
		}
	}
	outboxtest.ExpectNone(t, r, 500*time.Millisecond)
}
