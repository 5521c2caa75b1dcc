package outboxpgx

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// pgConsumer is the inbox and dead-letter SQL of PostgreSQL.
var pgConsumer = sqlstore.Postgres.(sqlstore.ConsumerDialect)

// TxHandler handles an event inside the transaction that also records it in the inbox.
type TxHandler[T outbox.Payload] func(ctx context.Context, tx pgx.Tx, e outbox.Event[T]) error

// Idempotent makes h's database effects happen exactly once per (consumer, event ID) in the
// default outbox's inbox. See [IdempotentAt].
func Idempotent[T outbox.Payload](db DB, h TxHandler[T]) consumer.Handler[T] {
	return IdempotentAt(defaultOutbox, db, h)
}

// IdempotentAt returns a consumer handler that opens a transaction on db, records
// (consumer name, event ID) in o's inbox with ON CONFLICT DO NOTHING, and runs h in that
// transaction only if the pair is new; a duplicate delivery commits nothing and is
// acknowledged. Write h's effects through tx: they commit together with the inbox row, so a
// crash before commit re-runs h on redelivery and a crash after commit (before the ack) is
// absorbed by the inbox.
func IdempotentAt[T outbox.Payload](o *Outbox, db DB, h TxHandler[T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			fresh, err := sqlstore.RecordInbox(ctx, sqlstore.Postgres, querier{tx}, o.names, e.ID)
			if err != nil {
				return fmt.Errorf("outboxpgx: %w", err)
			}
			if !fresh {
				return nil // handled before: a redelivery
			}
			return h(ctx, tx, e)
		})
	}
}

// SkipSeen is the at-least-once mode for handlers whose effects are outside this database
// (an e-mail, an HTTP call): it skips events the consumer already recorded, runs h, and
// records the event after h succeeds. A crash between h's success and the record runs h
// again on redelivery, so h itself must tolerate a rare repeat; what SkipSeen removes is the
// common duplicate (broker redelivery, a relay's re-send).
func SkipSeen[T outbox.Payload](db DB, h consumer.Handler[T]) consumer.Handler[T] {
	return SkipSeenAt(defaultOutbox, db, h)
}

// SkipSeenAt is [SkipSeen] on o's inbox.
func SkipSeenAt[T outbox.Payload](o *Outbox, db DB, h consumer.Handler[T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) error {
		seen, err := sqlstore.SeenInInbox(ctx, sqlstore.Postgres, querier{db}, o.names, e.ID)
		if err != nil || seen {
			return err
		}
		if err := h(ctx, e); err != nil {
			return err
		}
		_, err = sqlstore.RecordInbox(ctx, sqlstore.Postgres, querier{db}, o.names, e.ID)
		return err
	}
}

// PruneInbox deletes inbox rows older than retention, at most limit per call, and returns
// how many it deleted. Keep retention longer than the longest redelivery horizon (MaxAttempts
// × the longest backoff, plus the relay's): a pruned key no longer absorbs a duplicate. Call
// it periodically from one instance, e.g. every minute with limit 10,000.
func (o *Outbox) PruneInbox(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	return pgConsumer.PruneInbox(ctx, querier{db}, o.names, retention, limit)
}

// PruneInbox prunes the default outbox's inbox. See [Outbox.PruneInbox].
func PruneInbox(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	return defaultOutbox.PruneInbox(ctx, db, retention, limit)
}

// NewDeadLetters returns o's dead-letter table over db: the consumer's Config.DeadLetters,
// and the API to list, replay and discard.
func (o *Outbox) NewDeadLetters(db DB) deadletter.Table {
	return pgConsumer.DeadLetters(pool{db}, o.names)
}

// NewDeadLetters returns the default outbox's dead-letter table. See [Outbox.NewDeadLetters].
func NewDeadLetters(db DB) deadletter.Table { return defaultOutbox.NewDeadLetters(db) }
