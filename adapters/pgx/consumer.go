package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// pgConsumer is the inbox and dead-letter SQL of PostgreSQL.
var pgConsumer = sqlstore.Postgres.(sqlstore.ConsumerDialect)

// TxHandler handles an event inside the transaction that also records it in the inbox.
type TxHandler[T outbox.Payload] func(ctx context.Context, tx pgx.Tx, e outbox.Event[T]) error

// NewInbox returns o's idempotency-key table (the inbox) over db, for recording keys in your
// own pgx transactions, counting them and pruning them; Idempotent, SkipSeen and IdempotentHTTP
// are built on it. Its transactions are pgx.BeginFunc's on db.
func (o *Outbox) NewInbox(db DB) (idempotency.Inbox[pgx.Tx], error) {
	if db == nil {
		return nil, errors.New("outboxpgx: NewInbox needs a database (a *pgxpool.Pool), got nil")
	}
	return sqlstore.NewInbox("outboxpgx", sqlstore.Postgres, o.names, pool{DB: db},
		func(ctx context.Context, fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, db, fn) },
		func(tx pgx.Tx) (sqlstore.Querier, error) {
			if tx == nil {
				return nil, fmt.Errorf("outboxpgx: %w: got a nil pgx.Tx", outbox.ErrNotInTransaction)
			}
			return querier{Q: tx}, nil
		})
}

// NewDeadLetters returns o's dead-letter table over db: the consumer's Config.DeadLetters,
// and the API to list, replay and discard.
func (o *Outbox) NewDeadLetters(db DB) (deadletter.Table, error) {
	if db == nil {
		return nil, errors.New("outboxpgx: NewDeadLetters needs a database (a *pgxpool.Pool), got nil")
	}
	return pgConsumer.DeadLetters(pool{DB: db}, o.names), nil
}

// PruneInbox deletes o's inbox rows (and stored HTTP responses) older than retention, at
// most limit per call, and returns how many inbox rows it deleted. Keep retention longer
// than the longest redelivery horizon (MaxAttempts × the longest backoff, plus the relay's):
// a pruned key no longer absorbs a duplicate. Call it periodically from one instance, e.g.
// every minute with limit 10,000.
func (o *Outbox) PruneInbox(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	in, err := o.NewInbox(db)
	if err != nil {
		return 0, err
	}
	return in.Prune(ctx, retention, limit)
}

// IdempotentHTTP returns an http.Handler that runs h in a transaction on db at most once per
// Idempotency-Key request header, recording the key in o's inbox: a retried request that
// already committed gets the stored response, and publishes nothing new. Write h's rows and
// Publish its events through tx. If db is nil, every request gets a 500. See
// [idempotency.HTTPHandler].
func (o *Outbox) IdempotentHTTP(db DB, h idempotency.HTTPTxHandler[pgx.Tx], cfg *idempotency.HTTPConfig) http.Handler {
	in, err := o.NewInbox(db)
	if err != nil {
		return sqlstore.FailingHTTP(err)
	}
	return idempotency.HTTPHandler(in, h, cfg)
}

// Idempotent returns a consumer handler that makes h's effects happen exactly once per
// (consumer name, event ID): it begins a transaction on db, records the pair in o's inbox, and
// runs h in that transaction only if the pair is new; a duplicate delivery commits nothing and
// is acknowledged. Write h's effects through tx: they commit together with the inbox row, so a
// crash before commit re-runs h on redelivery and a crash after commit (before the ack) is
// absorbed by the inbox.
//
// Events handled at the same time share one transaction (group commit): one inbox statement and
// one commit for several of them, their handlers run one after another, so a busy consumer is
// not bound by the database's commits per second; an event handled alone has a transaction of
// its own. The group sizes its batches by its handlers' time: quick handlers share a few large
// batches, slow ones (a long query, a lock wait) run side by side in small ones, down to a
// transaction each. h may therefore run more than once for an event, every run but the last
// rolled back: when one handler of a shared transaction fails, the others are handled again,
// each alone, and only the failing one gets its error. cfg MaxEvents 1 gives every event its
// own transaction, always. cfg nil means the defaults. If db is nil, the handler fails every
// event permanently. See [idempotency.Group].
func Idempotent[T outbox.Payload](o *Outbox, db DB, h TxHandler[T], cfg *idempotency.GroupConfig) consumer.Handler[T] {
	in, err := o.NewInbox(db)
	if err != nil {
		return sqlstore.Failing[T](err)
	}
	return idempotency.NewGroup(in, idempotency.TxHandler[pgx.Tx, T](h), cfg).Handle
}

// SkipSeen is the at-least-once mode, for handlers whose effects are outside this database
// (an e-mail, an HTTP call): it skips events the consumer already recorded in o's inbox,
// runs h, and records the event after h succeeds. A crash between h's success and the record
// runs h again on redelivery, so h itself must tolerate a rare repeat; what SkipSeen removes
// is the common duplicate (broker redelivery, a relay's re-send). See
// [idempotency.SkipSeen].
func SkipSeen[T outbox.Payload](o *Outbox, db DB, h consumer.Handler[T]) consumer.Handler[T] {
	in, err := o.NewInbox(db)
	if err != nil {
		return sqlstore.Failing[T](err)
	}
	return idempotency.SkipSeen(in, h)
}
