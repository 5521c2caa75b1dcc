package outboxnats_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

type orderPlaced struct {
	OrderID string `json:"order_id"`
	Note    string `json:"note,omitempty"`
}

func (orderPlaced) EventType() string { return "orders.placed" }

func quietRelay(t testing.TB, p *pgxtest.Outbox, s outbox.Sender, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := relay.New(p.Store(t), s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// receiveAll receives n messages, acks them, and returns them by ID.
func receiveAll(t *testing.T, r outbox.Receiver, n int) map[uuid.UUID]outbox.Message {
	t.Helper()
	got := map[uuid.UUID]outbox.Message{}
	for _, d := range outboxtest.ReceiveN(t, r, n, 30*time.Second) {
		m, err := d.Message()
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := got[m.ID]; dup {
			t.Errorf("message %s received twice", m.ID)
		}
		got[m.ID] = m
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// TestEndToEnd: events committed with the caller's transaction go PostgreSQL outbox →
// relay → JetStream → receiver, each once; an event whose transaction rolled back never
// reaches the stream.
func TestEndToEnd(t *testing.T) {
	p := pgxtest.New(t, "outboxnats")
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{}, outboxnats.SenderConfig{})
	relay := quietRelay(t, p, d.sender, relay.Config{BatchSize: 50})

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := relay.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	defer func() { stop(); wg.Wait() }()

	committed := map[uuid.UUID]outbox.Event[orderPlaced]{}
	for tx := range 10 {
		var events []outbox.Encodable
		for i := range 20 {
			e := outbox.New(orderPlaced{OrderID: fmt.Sprintf("o-%d-%d", tx, i)},
				outbox.WithKey(fmt.Sprintf("customer-%d", i%4)), outbox.WithHeader("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
			committed[e.ID] = e
			events = append(events, e)
		}
		p.Commit(t, events...)
		relay.Wake()
	}
	rolledBack := outbox.New(orderPlaced{OrderID: "never"})
	tx, err := p.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Outbox.Publish(context.Background(), tx, rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}

	got := receiveAll(t, d.receiver, len(committed))
	for id, e := range committed {
		m, ok := got[id]
		if !ok {
			t.Fatalf("committed event %s was not delivered", id)
		}
		ev, err := outbox.Decode[orderPlaced](m)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Payload != e.Payload || ev.Key != e.Key || ev.Headers["traceparent"] != e.Headers["traceparent"] {
			t.Errorf("event %s arrived as %+v, want %+v", id, ev, e)
		}
	}

	// Stop the relay (Run returns after writing back its last batch), then check nothing
	// else was, or will be, published: the outbox is empty and the stream holds exactly
	// the committed events.
	stop()
	wg.Wait()
	if n := p.Count(t, "outbox"); n != 0 {
		t.Errorf("%d events left in the outbox", n)
	}
	if n := p.Count(t, "outbox_dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	if n := streamMsgs(t, d.stream); n != uint64(len(committed)) {
		t.Errorf("stream holds %d messages, want the %d committed", n, len(committed))
	}
	if _, ok := got[rolledBack.ID]; ok {
		t.Error("the rolled-back event was delivered")
	}
	outboxtest.ExpectNone(t, d.receiver, 500*time.Millisecond)
}

// TestRelayResendIsDeduplicated: a relay sends a batch and crashes before deleting it from
// the outbox; once its lease expires, another relay sends the batch again. The stream
// stores each event once (Nats-Msg-Id), its acks for the re-send say Duplicate, and the
// consumer receives each event once.
func TestRelayResendIsDeduplicated(t *testing.T) {
	p := pgxtest.New(t, "outboxnats")
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{}, outboxnats.SenderConfig{})
	var (
		mu   sync.Mutex
		acks []*jetstream.PubAck
	)
	outboxnats.SetOnAck(d.sender, func(_ outbox.Message, a *jetstream.PubAck) {
		mu.Lock()
		defer mu.Unlock()
		acks = append(acks, a)
	})
	const n = 3
	for i := range n {
		p.Commit(t, outbox.New(orderPlaced{OrderID: fmt.Sprint(i)}))
	}
	ctx := context.Background()

	// The crashed relay: claim with a lease that expires at once, send, never complete.
	claimed, err := p.Store(t).Claim(ctx, outboxdriver.ClaimParams{Owner: "crashed", Token: 1, Limit: 10, Lease: time.Millisecond})
	if err != nil || len(claimed) != n {
		t.Fatalf("claimed %d, %v", len(claimed), err)
	}
	var msgs []outbox.Message
	for _, c := range claimed {
		msgs = append(msgs, c.Message)
	}
	if err := d.sender.Send(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	// The relay that takes over re-claims the batch once the lease has expired.
	relay := quietRelay(t, p, d.sender, relay.Config{})
	deadline := time.Now().Add(10 * time.Second)
	for sent := 0; sent == 0; {
		if sent, err = relay.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if sent == 0 && time.Now().After(deadline) {
			t.Fatal("the expired lease was never re-claimed")
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if len(acks) != 2*n {
		t.Fatalf("%d acks, want %d", len(acks), 2*n)
	}
	first := map[uint64]bool{}
	for _, a := range acks[:n] {
		if a.Duplicate {
			t.Errorf("first send acked as duplicate: %+v", a)
		}
		first[a.Sequence] = true
	}
	for _, a := range acks[n:] {
		if !a.Duplicate || !first[a.Sequence] {
			t.Errorf("re-send ack %+v: want Duplicate with the first send's sequence", a)
		}
	}
	if got := streamMsgs(t, d.stream); got != n {
		t.Errorf("stream holds %d messages, want %d", got, n)
	}
	if left := p.Count(t, "outbox"); left != 0 {
		t.Errorf("%d events left in the outbox", left)
	}
	receiveAll(t, d.receiver, n)
	outboxtest.ExpectNone(t, d.receiver, 500*time.Millisecond)
}

type blob struct{ Data string }

func (blob) EventType() string { return "files.blob" }

// TestOversizeIsDeadLettered: an event over the server's max payload is dead-lettered by
// the relay on its first attempt, with a reason naming the limit; the rest of its batch is
// delivered.
func TestOversizeIsDeadLettered(t *testing.T) {
	p := pgxtest.New(t, "outboxnats")
	nc, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{}, outboxnats.SenderConfig{})
	limit := int(nc.MaxPayload())

	small1 := outbox.New(orderPlaced{OrderID: "before"}, outbox.WithKey("k"))
	big := outbox.New(blob{Data: strings.Repeat("x", limit)}, outbox.WithKey("big"))
	small2 := outbox.New(orderPlaced{OrderID: "after"})
	p.Commit(t, small1, big, small2)

	relay := quietRelay(t, p, d.sender, relay.Config{BatchSize: 10})
	if n, err := relay.RunOnce(context.Background()); err != nil || n != 3 {
		t.Fatalf("RunOnce = %d, %v; want the 3 events in one claim", n, err)
	}

	rows, err := p.Pool.Query(context.Background(),
		"SELECT event_id, reason, attempts, stage FROM "+p.Schema+".outbox_dead_letters")
	if err != nil {
		t.Fatal(err)
	}
	type deadLetter struct {
		ID       uuid.UUID
		Reason   string
		Attempts int
		Stage    string
	}
	var dead []deadLetter
	for rows.Next() {
		var dl deadLetter
		if err := rows.Scan(&dl.ID, &dl.Reason, &dl.Attempts, &dl.Stage); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, dl)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 {
		t.Fatalf("dead letters: %+v, want the big event alone", dead)
	}
	dl := dead[0]
	t.Logf("dead letter reason: %s", dl.Reason)
	if dl.ID != big.ID || dl.Attempts != 1 || dl.Stage != "relay" {
		t.Errorf("dead letter %+v, want event %s, attempts 1, stage relay", dl, big.ID)
	}
	for _, want := range []string{big.ID.String(), "over the server's max payload of " + fmt.Sprint(limit) + " bytes"} {
		if !strings.Contains(dl.Reason, want) {
			t.Errorf("reason %q does not name %q", dl.Reason, want)
		}
	}
	if left := p.Count(t, "outbox"); left != 0 {
		t.Errorf("%d events left in the outbox", left)
	}
	got := receiveAll(t, d.receiver, 2)
	if _, ok := got[small1.ID]; !ok {
		t.Error("the event before the big one was not delivered")
	}
	if _, ok := got[small2.ID]; !ok {
		t.Error("the event after the big one was not delivered")
	}
	outboxtest.ExpectNone(t, d.receiver, 500*time.Millisecond)
}
