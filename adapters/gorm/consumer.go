package outboxgorm

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// TxHandler handles an event inside the GORM transaction that also records it in the inbox.
type TxHandler[T outbox.Payload] func(ctx context.Context, tx *gorm.DB, e outbox.Event[T]) error

// Idempotent makes h's database effects happen exactly once per (consumer, event ID) in the
// default outbox's inbox. See [IdempotentAt].
func Idempotent[T outbox.Payload](db *gorm.DB, h TxHandler[T]) consumer.Handler[T] {
	return IdempotentAt(defaultOutbox, db, h)
}

// IdempotentAt returns a consumer handler that runs db.Transaction, records (consumer name,
// event ID) in o's inbox, and runs h in that transaction (its *gorm.DB carries the
// handler's context) only if the pair is new; a duplicate delivery commits nothing and is
// acknowledged. Write h's effects through tx: they commit together with the inbox row, so
// a crash before commit re-runs h on redelivery and a crash after commit (before the ack)
// is absorbed by the inbox.
func IdempotentAt[T outbox.Payload](o *Outbox, db *gorm.DB, h TxHandler[T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) error {
		d, n, err := o.dialect(db)
		if err != nil {
			return err
		}
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			fresh, err := sqlstore.RecordInbox(ctx, d, sqlstore.StdQuerier(tx.Statement.ConnPool), n, e.ID)
			if err != nil {
				return fmt.Errorf("outboxgorm: %w", err)
			}
			if !fresh {
				return nil // handled before: a redelivery
			}
			return h(ctx, tx, e)
		})
	}
}

// SkipSeen is the at-least-once mode for handlers whose effects are outside this database
// (an e-mail, an HTTP call), on the default outbox's inbox. See [SkipSeenAt].
func SkipSeen[T outbox.Payload](db *gorm.DB, h consumer.Handler[T]) consumer.Handler[T] {
	return SkipSeenAt(defaultOutbox, db, h)
}

// SkipSeenAt skips events the consumer already recorded in o's inbox, runs h, and records
// the event after h succeeds. A crash between h's success and the record runs h again on
// redelivery, so h itself must tolerate a rare repeat; what SkipSeen removes is the common
// duplicate (broker redelivery, a relay's re-send).
func SkipSeenAt[T outbox.Payload](o *Outbox, db *gorm.DB, h consumer.Handler[T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) error {
		d, n, err := o.dialect(db)
		if err != nil {
			return err
		}
		sqlDB, err := db.DB()
		if err != nil {
			return fmt.Errorf("outboxgorm: SkipSeen needs a *gorm.DB over a connection pool: %w", err)
		}
		q := sqlstore.StdDB(sqlDB)
		seen, err := sqlstore.SeenInInbox(ctx, d, q, n, e.ID)
		if err != nil || seen {
			return err
		}
		if err := h(ctx, e); err != nil {
			return err
		}
		_, err = sqlstore.RecordInbox(ctx, d, q, n, e.ID)
		return err
	}
}

// PruneInbox deletes inbox rows older than retention, at most limit per call, and returns
// how many it deleted. Keep retention longer than the longest redelivery horizon (MaxAttempts
// × the longest backoff, plus the relay's): a pruned key no longer absorbs a duplicate. Call
// it periodically from one instance.
func (o *Outbox) PruneInbox(db *gorm.DB, retention time.Duration, limit int) (int64, error) {
	c, n, sqlDB, err := o.consumer(db)
	if err != nil {
		return 0, err
	}
	count, err := c.PruneInbox(contextOf(db), sqlstore.StdDB(sqlDB), n, retention, limit)
	if err != nil {
		return count, fmt.Errorf("outboxgorm: pruning %s: %w", n.Inbox, err)
	}
	return count, nil
}

// PruneInbox prunes the default outbox's inbox. See [Outbox.PruneInbox].
func PruneInbox(db *gorm.DB, retention time.Duration, limit int) (int64, error) {
	return defaultOutbox.PruneInbox(db, retention, limit)
}

// NewDeadLetters returns o's dead-letter table over db's pool: the consumer's
// Config.DeadLetters, and the API to list, replay and discard.
func (o *Outbox) NewDeadLetters(db *gorm.DB) (deadletter.Table, error) {
	c, n, sqlDB, err := o.consumer(db)
	if err != nil {
		return nil, err
	}
	return c.DeadLetters(sqlstore.StdDB(sqlDB), n), nil
}

// NewDeadLetters returns the default outbox's dead-letter table. See [Outbox.NewDeadLetters].
func NewDeadLetters(db *gorm.DB) (deadletter.Table, error) { return defaultOutbox.NewDeadLetters(db) }

func (o *Outbox) consumer(db *gorm.DB) (sqlstore.ConsumerDialect, *sqlstore.Names, *sql.DB, error) {
	d, n, err := o.dialect(db)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := sqlstore.Consumer(d)
	if err != nil {
		return nil, nil, nil, err
	}
	pool, err := db.DB()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("outboxgorm: needs a *gorm.DB over a connection pool: %w", err)
	}
	return c, n, pool, nil
}
