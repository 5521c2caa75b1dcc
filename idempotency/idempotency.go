// Package idempotency is the idempotency-key table of an outbox — the inbox — and what is
// built on it, independent of the database driver or ORM: a key recorded in the caller's own
// transaction makes that transaction's effects happen once per key. It is for application
// developers, mostly through an adapter's Idempotent (group commit by default),
// SkipSeen and IdempotentHTTP.
//
// Every adapter (outboxpgx, outboxgorm, outboxbun, outboxsql) gives an [Inbox] over its
// transaction type through NewInbox, and wraps the helpers below in verbs of its own
// (Idempotent, SkipSeen, IdempotentHTTP, PruneInbox) that most applications call instead.
// Which one to use:
//
//   - [NewGroup] (an adapter's Idempotent) for a consumer whose effects are writes to the
//     same database: the key and the writes commit in one transaction, so each event's
//     effects happen exactly once, whatever the broker redelivers and whenever the process
//     dies. Events handled at the same time share one transaction and one commit (group
//     commit), so a busy consumer is not bound by the database's commits per second; an
//     event handled alone gets a transaction of its own. GroupConfig{MaxEvents: 1} gives
//     every event its own transaction: [Once], for handlers too slow to run in sequence.
//   - [SkipSeen] for a consumer whose effects are outside the database (an e-mail, a call to
//     another service): at least once, with the common duplicates skipped. The handler must
//     tolerate a rare repeat.
//   - [HTTPHandler] (IdempotentHTTP) for producers: a retried POST with the same
//     Idempotency-Key header gets the response of the request that already committed, and
//     its transaction — the business rows and the events it published — runs once.
//   - [Inbox.Record] directly, for code that runs its own transaction and wants the same
//     guarantee for some other kind of key.
//
// # Keys
//
// A [Key] is a consumer name and a UUID. A consumer's key is its name (consumer.Config.Name,
// which the consumer puts in handler contexts) and the event's ID, the UUIDv7 the event was
// given at outbox.New and keeps end to end. An HTTP request's key is "http:" plus the
// handler's scope, and a UUIDv5 of the Idempotency-Key header's value (see [RequestKey]).
// Keys are kept until pruned ([Inbox.Prune]): keep them longer than anything can redeliver
// or retry (the consumer's MaxAttempts × its longest backoff, plus the relay's), since a
// pruned key no longer absorbs a duplicate.
//
// # Tables
//
// The inbox is the table <outbox>_inbox (consumer, event_id, processed_at), primary key
// (consumer, event_id); the HTTP helper stores responses in <outbox>_http_responses. Both
// are created by the adapters' Migrate with the rest of the outbox.
package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
)

// Key identifies one thing handled once: who handled it and its ID.
type Key struct {
	// Consumer is the consumer's name, or "http:" and the scope for an HTTP request.
	Consumer string
	// EventID is the event's ID, or the UUIDv5 of an HTTP request's Idempotency-Key.
	EventID uuid.UUID
}

// String returns "consumer/event-id".
func (k Key) String() string { return k.Consumer + "/" + k.EventID.String() }

// EventKey returns the key of event id for the consumer handling ctx: the name that
// consumer.Consumer puts in its handlers' contexts (consumer.InfoFrom). A ctx without one is
// a permanent error (retrying cannot supply a name): call handlers through consumer.Consumer,
// or give them a context from consumer.WithInfo.
func EventKey(ctx context.Context, id uuid.UUID) (Key, error) {
	info, ok := consumer.InfoFrom(ctx)
	if !ok || info.Consumer == "" {
		return Key{}, outbox.Permanent(errors.New("idempotency: handler called without a consumer name in its context (run it through consumer.Consumer, or use consumer.WithInfo)"))
	}
	return Key{Consumer: info.Consumer, EventID: id}, nil
}

// httpNamespace is the UUIDv5 namespace of Idempotency-Key header values.
var httpNamespace = uuid.MustParse("2f3d8a57-4a4b-5c1e-9b0e-6f1d1c0e7a11")

// RequestKey returns the key under which [HTTPHandler] records a request of scope whose
// Idempotency-Key header is value: consumer "http:"+scope, and the UUIDv5 of value.
func RequestKey(scope, value string) Key {
	return Key{Consumer: "http:" + scope, EventID: uuid.NewSHA1(httpNamespace, []byte(value))}
}

// Inbox is the idempotency-key table of one outbox, as an adapter gives it for its
// transaction type TTx (pgx.Tx, *gorm.DB, bun.Tx, *sql.Tx). The adapters' NewInbox return
// one; the helpers of this package need nothing else.
type Inbox[TTx any] interface {
	// InTx runs fn in a new transaction on the inbox's database and commits it if fn returns
	// nil; an error or a panic rolls it back (the panic propagates).
	InTx(ctx context.Context, fn func(tx TTx) error) error
	// Record records key inside tx, the caller's transaction, and reports whether it is new.
	// It is false when a committed transaction recorded key before; when a transaction still
	// running recorded it, Record waits for that transaction to end. The key is recorded for
	// good only if tx commits.
	Record(ctx context.Context, tx TTx, key Key) (fresh bool, err error)
	// RecordMany is Record for several keys in one statement: fresh[i] is false when keys[i]
	// was recorded before, or appears earlier in keys. Depending on the database, a key that
	// a concurrent transaction records may fail the call instead of waiting for it: roll tx
	// back and record the keys one by one.
	RecordMany(ctx context.Context, tx TTx, keys []Key) (fresh []bool, err error)
	// Seen reports whether key is recorded by a committed transaction.
	Seen(ctx context.Context, key Key) (bool, error)
	// Prune deletes up to limit keys recorded more than retention ago, and the stored HTTP
	// responses as old, and returns how many keys it deleted. Call it periodically from one
	// instance, e.g. every minute with limit 10,000, until it returns less than limit.
	Prune(ctx context.Context, retention time.Duration, limit int) (int64, error)
	// Counts returns how many keys each consumer has recorded, by consumer name (HTTP
	// scopes as "http:<scope>").
	Counts(ctx context.Context) (map[string]int64, error)
	// SaveResponse stores the response to the HTTP request of key inside tx.
	SaveResponse(ctx context.Context, tx TTx, key Key, r Response) error
	// Response returns the response stored under key by a committed transaction, and false
	// if there is none.
	Response(ctx context.Context, key Key) (Response, bool, error)
}

// Response is an HTTP response stored by [HTTPHandler] for replay.
type Response struct {
	// RequestHash is the SHA-256 (hex) of the request that produced it: its method, URL and
	// body. A retry whose request differs is refused.
	RequestHash string
	// Status is the HTTP status code.
	Status int
	// Header is the response's header.
	Header http.Header
	// Body is the response's body.
	Body []byte
}

// TxHandler handles an event inside tx, the transaction that also records its key.
type TxHandler[TTx any, T outbox.Payload] func(ctx context.Context, tx TTx, e outbox.Event[T]) error

// Once returns a consumer handler that makes h's database effects happen exactly once per
// (consumer, event ID): it opens a transaction on in, records the event's key, and runs h
// in that transaction only if the key is new; a duplicate delivery commits nothing and is
// acknowledged. h must write its effects through tx: they commit together with the key, so
// a crash before commit re-runs h on redelivery and a crash after commit (before the ack)
// is absorbed by the key.
func Once[TTx any, T outbox.Payload](in Inbox[TTx], h TxHandler[TTx, T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) error {
		key, err := EventKey(ctx, e.ID)
		if err != nil {
			return err
		}
		duplicate := false
		err = in.InTx(ctx, func(tx TTx) error {
			fresh, err := in.Record(ctx, tx, key)
			if err != nil || !fresh {
				duplicate = err == nil
				return err // a duplicate: handled before
			}
			return h(ctx, tx, e)
		})
		if err == nil && duplicate {
			consumer.MarkDuplicate(ctx)
		}
		return err
	}
}

// SkipSeen is the at-least-once mode for handlers whose effects are outside the database (an
// e-mail, an HTTP call): it skips events whose key is already recorded in in, runs h, and
// records the key after h succeeds. A crash between h's success and the record runs h again
// on redelivery, so h itself must tolerate a rare repeat; what SkipSeen removes is the common
// duplicate (a broker's redelivery, a relay's re-send).
func SkipSeen[TTx any, T outbox.Payload](in Inbox[TTx], h consumer.Handler[T]) consumer.Handler[T] {
	return func(ctx context.Context, e outbox.Event[T]) error {
		key, err := EventKey(ctx, e.ID)
		if err != nil {
			return err
		}
		seen, err := in.Seen(ctx, key)
		if err != nil || seen {
			if seen {
				consumer.MarkDuplicate(ctx)
			}
			return err
		}
		if err := h(ctx, e); err != nil {
			return err
		}
		return in.InTx(ctx, func(tx TTx) error {
			_, err := in.Record(ctx, tx, key)
			return err
		})
	}
}
