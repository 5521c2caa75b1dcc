package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// TxHandler handles an event inside the transaction that also records it in the inbox.
type TxHandler[T outbox.Payload] func(ctx context.Context, tx *sql.Tx, e outbox.Event[T]) error

// IdempotentAt returns a consumer handler that begins a transaction on db, records (consumer
// name, event ID) in o's inbox, and runs h in that transaction only if the pair is new; a
// duplicate delivery commits nothing and is acknowledged. Write h's effects through tx:
// they commit together with the inbox row, so a crash before commit re-runs h on
// redelivery and a crash after commit (before the ack) is absorbed by the inbox.
func IdempotentAt[T outbox.Payload](o *Outbox, db *sql.DB, h TxHandler[T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) (err error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("outboxsql: beginning the handler's transaction: %w", err)
		}
		defer func() {
			if err != nil {
				if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
					err = errors.Join(err, rerr)
				}
			}
		}()
		fresh, err := sqlstore.RecordInbox(ctx, o.d, sqlstore.StdQuerier(tx), o.names, e.ID)
		if err != nil {
			return fmt.Errorf("outboxsql: %w", err)
		}
		if fresh {
			if err = h(ctx, tx, e); err != nil {
				return err
			}
		}
		return tx.Commit()
	}
}

// SkipSeenAt is the at-least-once mode for handlers whose effects are outside this database
// (an e-mail, an HTTP call): it skips events the consumer already recorded in o's inbox,
// runs h, and records the event after h succeeds. A crash between h's success and the
// record runs h again on redelivery, so h itself must tolerate a rare repeat; what SkipSeen
// removes is the common duplicate (broker redelivery, a relay's re-send).
func SkipSeenAt[T outbox.Payload](o *Outbox, db *sql.DB, h consumer.Handler[T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) error {
		q := sqlstore.StdDB(db)
		seen, err := sqlstore.SeenInInbox(ctx, o.d, q, o.names, e.ID)
		if err != nil || seen {
			return err
		}
		if err := h(ctx, e); err != nil {
			return err
		}
		_, err = sqlstore.RecordInbox(ctx, o.d, q, o.names, e.ID)
		return err
	}
}

// PruneInbox deletes inbox rows older than retention, at most limit per call, and returns
// how many it deleted. Keep retention longer than the longest redelivery horizon: a pruned
// key no longer absorbs a duplicate. Call it periodically from one instance.
func (o *Outbox) PruneInbox(ctx context.Context, db *sql.DB, retention time.Duration, limit int) (int64, error) {
	n, err := o.consumer().PruneInbox(ctx, sqlstore.StdDB(db), o.names, retention, limit)
	if err != nil {
		return n, fmt.Errorf("outboxsql: pruning %s: %w", o.names.Inbox, err)
	}
	return n, nil
}

// NewDeadLetters returns o's dead-letter table over db: the consumer's Config.DeadLetters,
// and the API to list, replay and discard.
func (o *Outbox) NewDeadLetters(db *sql.DB) deadletter.Table {
	return o.consumer().DeadLetters(sqlstore.StdDB(db), o.names)
}

// consumer returns the dialect's inbox and dead-letter SQL, which every dialect has.
func (o *Outbox) consumer() sqlstore.ConsumerDialect { return o.d.(sqlstore.ConsumerDialect) }
