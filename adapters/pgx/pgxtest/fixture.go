package pgxtest

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
)

// Fixture is the conformance suite's fixture of the outbox (outboxtest.ExerciseStore) with
// store as its relay store: the outbox's own, or another over the same table.
func (o *Outbox) Fixture(t testing.TB, store outboxdriver.Store) *outboxtest.StoreFixture {
	return &outboxtest.StoreFixture{
		Store: store,
		Publish: func(ctx context.Context, commit bool, events ...outbox.Encodable) error {
			return pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
				if err := o.Publish(ctx, tx, events...); err != nil {
					return err
				}
				if !commit {
					return ErrRollback
				}
				return nil
			})
		},
		Pending: func(ctx context.Context) (n int, err error) {
			err = o.Pool.QueryRow(ctx, "SELECT count(*) FROM "+o.Schema+".outbox").Scan(&n)
			return n, err
		},
		DeadLetters: func(ctx context.Context) ([]outboxtest.DeadLetterRow, error) {
			rows, _ := o.Pool.Query(ctx, "SELECT coalesce(event_id, '00000000-0000-0000-0000-000000000000'), stage, reason, attempts FROM "+o.Schema+".outbox_dead_letters ORDER BY id")
			return pgx.CollectRows(rows, pgx.RowToStructByPos[outboxtest.DeadLetterRow])
		},
		Cancel: func(ctx context.Context, commit bool, id uuid.UUID) (ok bool, err error) {
			err = pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
				if ok, err = o.Cancel(ctx, tx, id); err != nil {
					return err
				}
				if !commit {
					return ErrRollback
				}
				return nil
			})
			if err == ErrRollback {
				err = nil
			}
			return ok, err
		},
		PublishNilTx: func(ctx context.Context, events ...outbox.Encodable) error {
			return o.Publish(ctx, (*pgxpool.Tx)(nil), events...)
		},
		DeadLetterTable: o.DeadLetters(t),
		SQL:             o.RawSQL(),
		Unmigrate: func(ctx context.Context) error {
			_, err := o.Pool.Exec(ctx, "DROP SCHEMA "+o.Schema+" CASCADE")
			return err
		},
	}
}

// RawSQL reaches the outbox's tables with raw SQL, for the suites' poison tests.
func (o *Outbox) RawSQL() *outboxtest.RawSQL {
	return &outboxtest.RawSQL{
		Dialect: "postgres",
		Exec: func(ctx context.Context, query string) error {
			_, err := o.Pool.Exec(ctx, query)
			return err
		},
		Outbox:      o.Schema + ".outbox",
		DeadLetters: o.Schema + ".outbox_dead_letters",
		Lock: func(ctx context.Context) (func(), error) {
			tx, err := o.Pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE "+o.Schema+".outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
				_ = tx.Rollback(ctx)
				return nil, err
			}
			return func() { _ = tx.Rollback(context.Background()) }, nil
		},
		KillWaiting: func(ctx context.Context) (n int, err error) {
			err = o.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
 WHERE NOT granted AND relation = $1::regclass AND pid <> pg_backend_pid()`, o.Schema+".outbox").Scan(&n)
			return n, err
		},
	}
}

type rollback struct{}

func (rollback) Error() string { return "rolled back on purpose" }

// ErrRollback is what the fixture's Publish and Cancel return from a transaction they roll
// back on purpose (commit false); Cancel hides it.
var ErrRollback error = rollback{}
