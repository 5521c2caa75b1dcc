package outboxazqueue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// FileUploaded is the test's event payload.
type FileUploaded struct {
	N    int    `json:"n"`
	Name string `json:"name"`
}

func (FileUploaded) EventType() string { return "files.uploaded" }

// pgOutbox is an outbox in a PostgreSQL schema of its own, dropped when the test ends.
func pgOutbox(t testing.TB) (*pgxpool.Pool, *outboxpgx.Outbox, string) {
	t.Helper()
	o := pgxtest.New(t, "azq")
	return o.Pool, o.Outbox, o.Schema
}

// relayStore is ob's relay store over pool.
func relayStore(t testing.TB, ob *outboxpgx.Outbox, pool *pgxpool.Pool) outboxdriver.Store {
	t.Helper()
	s, err := ob.NewStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// deadLetters is ob's dead-letter table over pool.
func deadLetters(t testing.TB, ob *outboxpgx.Outbox, pool *pgxpool.Pool) deadletter.Table {
	t.Helper()
	d, err := ob.NewDeadLetters(pool)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitDrained waits until the relay has completed every event of the outbox.
func waitDrained(t testing.TB, pool *pgxpool.Pool, schema string) {
	t.Helper()
	outboxtest.WaitFor(t, 30*time.Second, "the outbox to drain", func() bool {
		var left int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".outbox").Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testLogger shows the relay's warnings and errors in the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// publish writes events in one transaction and commits it, or rolls it back.
func publish(t testing.TB, pool *pgxpool.Pool, ob *outboxpgx.Outbox, commit bool, events ...outbox.Encodable) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := ob.Publish(ctx, tx, events...); err != nil {
			return err
		}
		if !commit {
			return errRollback
		}
		return nil
	})
	if err != nil && !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
}

var errRollback = errors.New("roll back on purpose")

// TestEndToEnd: events published in PostgreSQL transactions reach a consumer through the
// relay and Azure Queue Storage: every committed event once at least, rolled-back ones never.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	pool, ob, schema := pgOutbox(t)
	client := serviceClient(t)
	queue := newQueue(t, client)

	sender, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: queue})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := relay.New(relayStore(t, ob, pool), sender, &relay.Config{MaxPollInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(ctx) }()
	defer func() {
		stop()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	}()

	want := map[uuid.UUID]FileUploaded{}
	var rolledBack []uuid.UUID
	for i := range 40 {
		// Even transactions commit, every fifth rolls back; some carry a key, some several events.
		var evs []outbox.Encodable
		var ids []uuid.UUID
		for j := range 1 + i%3 {
			var opts []outbox.Option
			if i%2 == 0 {
				opts = append(opts, outbox.WithKey(fmt.Sprintf("file-%d", j)))
			}
			e := outbox.New(FileUploaded{N: i*10 + j, Name: fmt.Sprintf("f%d-%d.csv", i, j)}, opts...)
			evs, ids = append(evs, e), append(ids, e.ID)
			if i%5 != 4 {
				want[e.ID] = e.Payload
			}
		}
		if i%5 == 4 {
			rolledBack = append(rolledBack, ids...)
		}
		publish(t, pool, ob, i%5 != 4, evs...)
	}

	r, err := outboxazqueue.NewReceiver(client.NewQueueClient(queue), fastReceiver)
	if err != nil {
		t.Fatal(err)
	}
	// Receive until every committed event arrived, then for a moment more: duplicates of
	// committed events are allowed (at-least-once), anything else is not.
	got := map[uuid.UUID]int{}
	check := func(ds []outbox.Delivery) {
		for _, d := range ds {
			m, err := d.Message()
			if err != nil {
				t.Fatal(err)
			}
			e, err := outbox.Decode[FileUploaded](m)
			if err != nil {
				t.Fatal(err)
			}
			if p, ok := want[e.ID]; !ok || p != e.Payload {
				t.Errorf("received %s %+v; want only committed events", e.ID, e.Payload)
			}
			got[e.ID]++
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(got) < len(want) {
		ds, err := r.Receive(rctx, 32)
		if err != nil {
			t.Fatalf("received %d of %d committed events, then: %v", len(got), len(want), err)
		}
		check(ds)
	}
	// Once the relay has written its last batch back, nothing else is on its way.
	waitDrained(t, pool, schema)
	quiet, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	for quiet.Err() == nil {
		ds, _ := r.Receive(quiet, 32)
		check(ds)
	}
	for _, id := range rolledBack {
		if got[id] > 0 {
			t.Errorf("rolled-back event %s was delivered", id)
		}
	}
	t.Logf("%d committed events delivered, %d rolled-back events never sent", len(got), len(rolledBack))
}

// TestOversizeDeadLettered: an event over the 64 KiB limit, published through the outbox,
// is dead-lettered by the relay on its first attempt with a reason naming the limit, and the
// rest of its batch is delivered.
func TestOversizeDeadLettered(t *testing.T) {
	t.Parallel()
	pool, ob, schema := pgOutbox(t)
	client := serviceClient(t)
	queue := newQueue(t, client)
	sender, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: queue})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := relay.New(relayStore(t, ob, pool), sender, &relay.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}

	small := []outbox.Event[FileUploaded]{
		outbox.New(FileUploaded{N: 1, Name: "a.csv"}),
		outbox.New(FileUploaded{N: 2, Name: "b.csv"}, outbox.WithKey("k")),
		outbox.New(FileUploaded{N: 3, Name: "c.csv"}),
	}
	big := outbox.New(FileUploaded{N: 4, Name: strings.Repeat("x", 52<<10)})
	publish(t, pool, ob, true, small[0], big, small[1], small[2])

	// One relay cycle claims the whole batch: the verdict on the big event needs no retry.
	if n, err := relay.RunOnce(context.Background()); err != nil || n != 4 {
		t.Fatalf("RunOnce = %d, %v; want the 4 events claimed", n, err)
	}

	var (
		eventID  uuid.UUID
		reason   string
		attempts int
		stage    string
	)
	err = pool.QueryRow(context.Background(), "SELECT event_id, reason, attempts, stage FROM "+schema+".outbox_dead_letters").Scan(&eventID, &reason, &attempts, &stage)
	if err != nil {
		t.Fatalf("reading the dead letter: %v", err)
	}
	if eventID != big.ID || attempts != 1 || stage != "relay" {
		t.Errorf("dead letter (%s, attempts %d, stage %s); want (%s, 1, relay)", eventID, attempts, stage, big.ID)
	}
	if !strings.Contains(reason, "over the Azure Queue Storage limit of 64 KiB") || !strings.Contains(reason, big.ID.String()) {
		t.Errorf("reason %q should name the event and the limit", reason)
	}
	t.Logf("dead-letter reason: %s", reason)

	r, err := outboxazqueue.NewReceiver(client.NewQueueClient(queue), fastReceiver)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]bool{}
	for _, d := range outboxtest.ReceiveN(t, r, len(small), 10*time.Second) {
		m, err := d.Message()
		if err != nil {
			t.Fatal(err)
		}
		got[m.ID] = true
		_ = d.Ack(context.Background())
	}
	for _, e := range small {
		if !got[e.ID] {
			t.Errorf("event %s of the batch was not delivered", e.ID)
		}
	}
	var left int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".outbox").Scan(&left); err != nil || left != 0 {
		t.Fatalf("outbox still holds %d events (%v)", left, err)
	}
}
