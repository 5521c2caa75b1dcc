package outboxpgx_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// TestGroupedCommitsFewerTransactions: with 16 events in flight, events really share
// PostgreSQL transactions: far fewer distinct transaction IDs than events, each event with
// exactly one effect. (The group-commit cases every adapter runs are in
// outboxtest.ExerciseIdempotency.)
func TestGroupedCommitsFewerTransactions(t *testing.T) {
	const events = 400
	ctx := context.Background()
	o := newTestOutbox(t)
	effects := o.schema + ".effects"
	if _, err := o.pool.Exec(ctx, "CREATE TABLE "+effects+" (event_id uuid NOT NULL, xid bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	h := outboxpgx.Idempotent(o.Outbox, o.pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[outboxtestNote]) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1, txid_current())", e.ID)
		return err
	}, nil)

	q := outboxmemory.New(nil)
	msgs := make([]outbox.Message, events)
	for i := range msgs {
		msgs[i], _ = outbox.New(outboxtestNote{N: i}).Encode()
	}
	if err := q.Send(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(q, &consumer.Config{Name: "grouped", DeadLetters: o.deadLetters(t),
		Concurrency: 16, BatchSize: 16, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, h)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(rctx) }()
	outboxtest.WaitFor(t, time.Minute, "the consumer to settle every message", func() bool { return q.Len() == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var rows, distinct, txs int
	if err := o.pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT event_id), count(DISTINCT xid) FROM "+effects).Scan(&rows, &distinct, &txs); err != nil {
		t.Fatal(err)
	}
	if rows != events || distinct != events {
		t.Fatalf("%d effect rows for %d events, want %d for %d", rows, distinct, events, events)
	}
	t.Logf("%d events in %d transactions (%.1f per transaction)", events, txs, float64(events)/float64(txs))
	// Ungrouped, 400 events take 400 transactions; grouped, 83–123 were measured. The bound
	// is loose so that a loaded machine cannot fail it; outboxtest's BatchesHandOff pins the
	// exact batching.
	if txs > events*3/4 {
		t.Fatalf("%d events took %d transactions: the events were not grouped", events, txs)
	}
}
