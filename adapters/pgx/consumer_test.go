package outboxpgx_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestIdempotency runs the idempotency suite through the Outbox's methods and the …At
// functions, on an outbox in a schema of its own.
func TestIdempotency(t *testing.T) {
	outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture[pgx.Tx] {
		o := newTestOutbox(t)
		f := o.idempotencyFixture(t, o.pool)
		var err error
		if f.Store, err = o.NewStore(o.pool); err != nil {
			t.Fatal(err)
		}
		if f.DeadLetters, err = o.NewDeadLetters(o.pool); err != nil {
			t.Fatal(err)
		}
		if f.Inbox, err = o.NewInbox(o.pool); err != nil {
			t.Fatal(err)
		}
		f.Publish = func(ctx context.Context, tx pgx.Tx, events ...outbox.Encodable) error {
			return o.Publish(ctx, tx, events...)
		}
		f.Idempotent = func(h idempotency.TxHandler[pgx.Tx, outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxpgx.IdempotentAt(o.Outbox, o.pool, outboxpgx.TxHandler[outboxtest.Note](h))
		}
		f.IdempotentGrouped = func(h idempotency.TxHandler[pgx.Tx, outboxtest.Note], cfg *idempotency.GroupConfig) consumer.Handler[outboxtest.Note] {
			return outboxpgx.IdempotentGroupedAt(o.Outbox, o.pool, outboxpgx.TxHandler[outboxtest.Note](h), cfg)
		}
		f.SkipSeen = func(h consumer.Handler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxpgx.SkipSeenAt(o.Outbox, o.pool, h)
		}
		f.IdempotentHTTP = func(h idempotency.HTTPTxHandler[pgx.Tx], cfg *idempotency.HTTPConfig) http.Handler {
			return outboxpgx.IdempotentHTTPAt(o.Outbox, o.pool, h, cfg)
		}
		f.PruneInbox = func(ctx context.Context, retention time.Duration, limit int) (int64, error) {
			return o.PruneInbox(ctx, o.pool, retention, limit)
		}
		return f
	})
}

// TestIdempotencyDefaultNames runs the idempotency suite through the package-level
// functions, on a pool whose search_path is the test's schema.
func TestIdempotencyDefaultNames(t *testing.T) {
	outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture[pgx.Tx] {
		o := newTestOutbox(t)
		pool := o.pt.SearchPathPool(t)
		f := o.idempotencyFixture(t, pool)
		var err error
		if f.Store, err = outboxpgx.NewStore(pool); err != nil {
			t.Fatal(err)
		}
		if f.DeadLetters, err = outboxpgx.NewDeadLetters(pool); err != nil {
			t.Fatal(err)
		}
		if f.Inbox, err = outboxpgx.NewInbox(pool); err != nil {
			t.Fatal(err)
		}
		f.Publish = func(ctx context.Context, tx pgx.Tx, events ...outbox.Encodable) error {
			return outboxpgx.Publish(ctx, tx, events...)
		}
		f.Idempotent = func(h idempotency.TxHandler[pgx.Tx, outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxpgx.Idempotent(pool, outboxpgx.TxHandler[outboxtest.Note](h))
		}
		f.IdempotentGrouped = func(h idempotency.TxHandler[pgx.Tx, outboxtest.Note], cfg *idempotency.GroupConfig) consumer.Handler[outboxtest.Note] {
			return outboxpgx.IdempotentGrouped(pool, outboxpgx.TxHandler[outboxtest.Note](h), cfg)
		}
		f.SkipSeen = func(h consumer.Handler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxpgx.SkipSeen(pool, h)
		}
		f.IdempotentHTTP = func(h idempotency.HTTPTxHandler[pgx.Tx], cfg *idempotency.HTTPConfig) http.Handler {
			return outboxpgx.IdempotentHTTP(pool, h, cfg)
		}
		f.PruneInbox = func(ctx context.Context, retention time.Duration, limit int) (int64, error) {
			return outboxpgx.PruneInbox(ctx, pool, retention, limit)
		}
		return f
	})
}

// idempotencyFixture returns the suite's fixture without the adapter's verbs: an effects
// table, and the outbox and inbox read through pool.
func (o *testOutbox) idempotencyFixture(t *testing.T, pool *pgxpool.Pool) *outboxtest.IdempotencyFixture[pgx.Tx] {
	effects := o.schema + ".effects"
	if _, err := o.pool.Exec(context.Background(), "CREATE TABLE "+effects+" (id uuid NOT NULL, text text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return &outboxtest.IdempotencyFixture[pgx.Tx]{
		Effect: func(ctx context.Context, tx pgx.Tx, id, text string) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (id, text) VALUES ($1, $2)", id, text)
			return err
		},
		Effects: func(ctx context.Context) (map[string]int, error) {
			rows, _ := pool.Query(ctx, "SELECT text, count(*)::int FROM "+effects+" GROUP BY text")
			out := map[string]int{}
			var text string
			var n int
			_, err := pgx.ForEachRow(rows, []any{&text, &n}, func() error { out[text] = n; return nil })
			return out, err
		},
		Pending: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, "SELECT count(*) FROM "+o.schema+".outbox").Scan(&n)
			return n, err
		},
		AgeInbox: func(ctx context.Context, d time.Duration) error {
			for _, table := range []string{"outbox_inbox", "outbox_http_responses"} {
				if _, err := pool.Exec(ctx, "UPDATE "+o.schema+"."+table+" SET processed_at = processed_at - $1::interval", d); err != nil {
					return err
				}
			}
			return nil
		},
		SQL: o.rawSQL(),
		Unmigrate: func(ctx context.Context) error {
			_, err := o.pool.Exec(ctx, "DROP SCHEMA "+o.schema+" CASCADE")
			return err
		},
	}
}
