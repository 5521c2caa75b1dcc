package sqlstore

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
)

// Inbox is idempotency.Inbox over a dialect's SQL, for an adapter's transaction type TTx:
// the adapter supplies how to open a transaction and how to run statements in one, and
// everything else is shared.
type Inbox[TTx any] struct {
	// Adapter names the adapter in errors ("outboxpgx").
	Adapter string
	Dialect ConsumerDialect
	Names   *Names
	// DB runs what happens outside the caller's transaction: Seen, Prune, Counts, Response.
	DB DB
	// Begin runs fn in a new transaction on the adapter's database, committing it when fn
	// returns nil and rolling it back otherwise, also on a panic.
	Begin func(ctx context.Context, fn func(tx TTx) error) error
	// Tx returns the statements of the caller's transaction tx, or an error when tx is not
	// a transaction.
	Tx func(tx TTx) (Querier, error)
}

var _ idempotency.Inbox[struct{}] = (*Inbox[struct{}])(nil)

// NewInbox returns the inbox of d over names, or an error naming the dialect if it has none.
func NewInbox[TTx any](adapter string, d Dialect, n *Names, db DB, begin func(context.Context, func(TTx) error) error, tx func(TTx) (Querier, error)) (*Inbox[TTx], error) {
	c, err := Consumer(d)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", adapter, err)
	}
	return &Inbox[TTx]{Adapter: adapter, Dialect: c, Names: n, DB: db, Begin: begin, Tx: tx}, nil
}

// InTx implements idempotency.Inbox. An error that says the database is down or the
// connection broke (beginning, committing, or in any statement of the transaction, the
// handler's included) is marked outbox.Unavailable: not the message's fault.
func (in *Inbox[TTx]) InTx(ctx context.Context, fn func(tx TTx) error) error {
	return classifyUnavailable(in.Begin(ctx, fn))
}

// Record implements idempotency.Inbox.
func (in *Inbox[TTx]) Record(ctx context.Context, tx TTx, key idempotency.Key) (bool, error) {
	q, err := in.Tx(tx)
	if err != nil {
		return false, err
	}
	fresh, err := in.Dialect.InsertInbox(ctx, q, in.Names, key)
	if err != nil {
		return false, fmt.Errorf("%s: recording %s in %s: %w", in.Adapter, key, in.Names.Inbox, Classify(err, in.Names))
	}
	return fresh, nil
}

// RecordMany implements idempotency.Inbox.
func (in *Inbox[TTx]) RecordMany(ctx context.Context, tx TTx, keys []idempotency.Key) ([]bool, error) {
	q, err := in.Tx(tx)
	if err != nil {
		return nil, err
	}
	fresh, err := in.Dialect.InsertInboxMany(ctx, q, in.Names, keys)
	if err != nil {
		return nil, fmt.Errorf("%s: recording %d keys in %s: %w", in.Adapter, len(keys), in.Names.Inbox, Classify(err, in.Names))
	}
	return fresh, nil
}

// Seen implements idempotency.Inbox.
func (in *Inbox[TTx]) Seen(ctx context.Context, key idempotency.Key) (bool, error) {
	seen, err := in.Dialect.SeenInbox(ctx, in.DB, in.Names, key)
	if err != nil {
		return false, fmt.Errorf("%s: looking %s up in %s: %w", in.Adapter, key, in.Names.Inbox, Classify(err, in.Names))
	}
	return seen, nil
}

// Prune implements idempotency.Inbox.
func (in *Inbox[TTx]) Prune(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%s: pruning %s: limit %d is not positive", in.Adapter, in.Names.Inbox, limit)
	}
	n, err := in.Dialect.PruneInbox(ctx, in.DB, in.Names, retention, limit)
	if err != nil {
		return n, fmt.Errorf("%s: pruning %s: %w", in.Adapter, in.Names.Inbox, Classify(err, in.Names))
	}
	return n, nil
}

// Counts implements idempotency.Inbox.
func (in *Inbox[TTx]) Counts(ctx context.Context) (map[string]int64, error) {
	rows, err := in.DB.Query(ctx, "SELECT consumer, count(*) FROM "+in.Names.Inbox+" GROUP BY consumer")
	if err != nil {
		return nil, fmt.Errorf("%s: counting %s: %w", in.Adapter, in.Names.Inbox, Classify(err, in.Names))
	}
	defer rows.Close()
	counts := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, fmt.Errorf("%s: counting %s: %w", in.Adapter, in.Names.Inbox, Classify(err, in.Names))
		}
		counts[name] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: counting %s: %w", in.Adapter, in.Names.Inbox, Classify(err, in.Names))
	}
	return counts, nil
}

// SaveResponse implements idempotency.Inbox.
func (in *Inbox[TTx]) SaveResponse(ctx context.Context, tx TTx, key idempotency.Key, r idempotency.Response) error {
	q, err := in.Tx(tx)
	if err != nil {
		return err
	}
	if err := in.Dialect.SaveResponse(ctx, q, in.Names, key, r); err != nil {
		return fmt.Errorf("%s: storing the response of %s in %s: %w", in.Adapter, key, in.Names.Responses, Classify(err, in.Names))
	}
	return nil
}

// Response implements idempotency.Inbox.
func (in *Inbox[TTx]) Response(ctx context.Context, key idempotency.Key) (idempotency.Response, bool, error) {
	r, found, err := in.Dialect.LoadResponse(ctx, in.DB, in.Names, key)
	if err != nil {
		return r, false, fmt.Errorf("%s: reading the response of %s from %s: %w", in.Adapter, key, in.Names.Responses, Classify(err, in.Names))
	}
	return r, found, nil
}

// Failing returns a handler that fails every event permanently with err: what an adapter's
// Idempotent returns when it cannot build its inbox (an unsupported database), so the
// problem surfaces as a dead letter with its reason rather than as retries.
func Failing[T outbox.Payload](err error) consumer.Handler[T] {
	err = outbox.Permanent(err)
	return func(context.Context, outbox.Event[T]) error { return err }
}

// FailingHTTP is Failing for an adapter's IdempotentHTTP: every request gets a 500, and err
// is logged once per request.
func FailingHTTP(err error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slog.ErrorContext(r.Context(), "idempotency: the handler cannot run", "error", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
	})
}
