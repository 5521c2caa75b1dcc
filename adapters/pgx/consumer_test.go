package outboxpgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
)

func TestIdempotency(t *testing.T) {
	exerciseIdempotency(t, func(o *testOutbox, h outboxpgx.TxHandler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
		return outboxpgx.IdempotentAt(o.Outbox, o.pool, h)
	})
}

// exerciseIdempotency runs the adapters' exactly-once and dead-letter suite against the
// consumer handler that wrap makes of a TxHandler writing one effect row per call.
func exerciseIdempotency(t *testing.T, wrap func(*testOutbox, outboxpgx.TxHandler[outboxtest.Note]) consumer.Handler[outboxtest.Note]) {
	outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture {
		o := newTestOutbox(t)
		effects := o.schema + ".effects"
		if _, err := o.pool.Exec(context.Background(), "CREATE TABLE "+effects+" (event_id uuid NOT NULL, text text NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		return &outboxtest.IdempotencyFixture{
			Store: o.NewStore(o.pool),
			Handler: func(fail func(outbox.Event[outboxtest.Note]) error) consumer.Handler[outboxtest.Note] {
				return wrap(o, func(ctx context.Context, tx pgx.Tx, e outbox.Event[outboxtest.Note]) error {
					if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1, $2)", e.ID, e.Payload.Text); err != nil {
						return err
					}
					return fail(e)
				})
			},
			Effects: func(ctx context.Context) (n int, err error) {
				err = o.pool.QueryRow(ctx, "SELECT count(*) FROM "+effects).Scan(&n)
				return n, err
			},
			DeadLetters: o.NewDeadLetters(o.pool),
		}
	})
}

func TestPruneInbox(t *testing.T) {
	o := newTestOutbox(t)
	ctx := consumer.WithInfo(context.Background(), consumer.Info{Consumer: "pruner"})
	h := outboxpgx.IdempotentAt(o.Outbox, o.pool, func(context.Context, pgx.Tx, outbox.Event[outboxtestNote]) error { return nil })
	for i := range 5 {
		if err := h(ctx, outbox.New(outboxtestNote{N: i})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := o.pool.Exec(ctx, "UPDATE "+o.schema+".outbox_inbox SET processed_at = now() - interval '2 days' WHERE event_id IN (SELECT event_id FROM "+o.schema+".outbox_inbox LIMIT 3)"); err != nil {
		t.Fatal(err)
	}
	n, err := o.PruneInbox(ctx, o.pool, 24*time.Hour, 2)
	if err != nil || n != 2 {
		t.Fatalf("first prune: %d, %v; want 2 (the limit)", n, err)
	}
	n, err = o.PruneInbox(ctx, o.pool, 24*time.Hour, 100)
	if err != nil || n != 1 {
		t.Fatalf("second prune: %d, %v; want the last expired row", n, err)
	}
	var left int
	_ = o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".outbox_inbox").Scan(&left)
	if left != 2 {
		t.Fatalf("%d inbox rows left, want the 2 recent ones", left)
	}
}

func TestIdempotentNeedsConsumerName(t *testing.T) {
	o := newTestOutbox(t)
	h := outboxpgx.IdempotentAt(o.Outbox, o.pool, func(context.Context, pgx.Tx, outbox.Event[outboxtestNote]) error { return nil })
	if err := h(context.Background(), outbox.New(outboxtestNote{})); err == nil || !outbox.IsPermanent(err) {
		t.Fatalf("err = %v, want a permanent error about the missing consumer name", err)
	}
}
