package claimcheck

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
)

// MissingError is the error of a claim-checked message whose blob cannot be had: not in the
// store, or named outside it. The consumer dead-letters the message at once, with kind
// [deadletter.KindBlobMissing].
type MissingError struct {
	ID  string // the event ID
	Ref string // the dataref
	Err error
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("claimcheck: event %s: blob %s: %v", e.ID, e.Ref, e.Err)
}

func (e *MissingError) Unwrap() error { return e.Err }

// DeadLetterKind implements [deadletter.Classified].
func (e *MissingError) DeadLetterKind() deadletter.Kind { return deadletter.KindBlobMissing }

// Resolve returns the consumer middleware that fetches a claim-checked message's body from
// store before the handler decodes it, and removes the [Header]: handlers, typed or
// idempotent, see the message as it was published. Messages without the header pass through
// unchanged. A blob that is not in store, or a reference to another store, fails the
// message with a permanent [*MissingError] (a dead letter of kind blob-missing); any other
// failure to read the blob is marked [outbox.Unavailable], so the consumer retries it
// without counting an attempt. Put it in consumer.Config.Middleware:
//
//	consumer.New(recv, &consumer.Config{Name: "parser", Middleware: []consumer.Middleware{claimcheck.Resolve(store)}, …})
func Resolve(store BlobStore) consumer.Middleware {
	prefix := store.Ref("")
	return func(next consumer.MessageHandler) consumer.MessageHandler {
		return func(ctx context.Context, m outbox.Message) error {
			ref := m.Headers[Header]
			if ref == "" {
				return next(ctx, m)
			}
			missing := func(err error) error {
				return outbox.Permanent(&MissingError{ID: m.ID.String(), Ref: ref, Err: err})
			}
			key, ours := strings.CutPrefix(ref, prefix)
			if !ours {
				return missing(fmt.Errorf("not a blob of this consumer's store (%s)", prefix))
			}
			if err := ValidKey(key); err != nil {
				return missing(err)
			}
			body, err := store.Get(ctx, key)
			switch {
			case errors.Is(err, ErrNotFound):
				return missing(err)
			case err != nil && ctx.Err() != nil:
				return err
			case err != nil:
				return outbox.Unavailable(fmt.Errorf("claimcheck: event %s: reading blob %s: %w", m.ID, ref, err))
			}
			m.Body = body
			m.Headers = maps.Clone(m.Headers)
			delete(m.Headers, Header)
			return next(ctx, m)
		}
	}
}
