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

// TestIdempotency runs the idempotency suite on an outbox in a schema of its own.
func TestIdempotency(t *testing.T) {
	outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture[pgx.Tx] {
		o := newTestOutbox(t)
		return o.idempotencyFixture(t, o.Outbox, o.pool)
	})
}

// TestIdempotencyDefaultNames runs the idempotency suite through outboxpgx.Default, on a
// pool whose search_path is the test's schema.
func TestIdempotencyDefaultNames(t *testing.T) {
	outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture[pgx.Tx] {
		o := newTestOutbox(t)
		return o.idempotencyFixture(t, outboxpgx.Default, o.pt.SearchPathPool(t))
	})
}

// idempotencyFixture returns the suite's fixture: ob's verbs over pool (which reaches o's
// tables through ob's names), an effects table, and the outbox and inbox read through pool.
func (o *testOutbox) idempotencyFixture(t *testing.T, ob *outboxpgx.Outbox, pool *pgxpool.Pool) *outboxtest.IdempotencyFixture[pgx.Tx] {
	effects := o.schema + ".effects"
	if _, err := o.pool.Exec(context.Background(), "CREATE TABLE "+effects+" (id uuid NOT NULL, text text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return &outboxtest.IdempotencyFixture[pgx.Tx]{
		Store:       mustStore(t, ob, pool),
		DeadLetters: must(ob.NewDeadLetters(pool))(t),
		Inbox:       must(ob.NewInbox(pool))(t),
		Publish: func(ctx context.Context, tx pgx.Tx, events ...outbox.Encodable) error {
			return ob.Publish(ctx, tx, events...)
		},
		Idempotent: func(h idempotency.TxHandler[pgx.Tx, outboxtest.Note], cfg *idempotency.GroupConfig) consumer.Handler[outboxtest.Note] {
			return outboxpgx.Idempotent(ob, pool, outboxpgx.TxHandler[outboxtest.Note](h), cfg)
		},
		SkipSeen: func(h consumer.Handler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxpgx.SkipSeen(ob, pool, h)
		},
		IdempotentHTTP: func(h idempotency.HTTPTxHandler[pgx.Tx], cfg *idempotency.HTTPConfig) http.Handler {
			return ob.IdempotentHTTP(pool, h, cfg)
		},
		PruneInbox: func(ctx context.Context, retention time.Duration, limit int) (int64, error) {
			return ob.PruneInbox(ctx, pool, retention, limit)
		},
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

// must returns a function that fails t if err is set, and returns v otherwise.
func must[V any](v V, err error) func(t *testing.T) V {
	return func(t *testing.T) V {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}
