package outboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
)

// exerciseInboxOutages runs the consumer side of "a missing schema and a database that is
// down are named as such": the inbox wrappers and the dead-letter table of an outbox that
// was never migrated fail with errors wrapping outbox.ErrSchema, and a handler whose
// database connection is dropped fails with an error for which outbox.IsUnavailable is true,
// so the consumer retries it instead of counting it toward a dead letter.
func exerciseInboxOutages[TTx any](t *testing.T, newFixture func(t *testing.T) *IdempotencyFixture[TTx]) {
	t.Run("UnmigratedInboxIsNamed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if f.Unmigrate == nil {
			t.Skip("the fixture cannot unmigrate its outbox")
		}
		ctx := consumer.WithInfo(context.Background(), consumer.Info{Consumer: "unmigrated", Attempt: 1})
		if err := f.Unmigrate(ctx); err != nil {
			t.Fatal(err)
		}
		ran := false
		h := func(context.Context, TTx, outbox.Event[Note]) error { ran = true; return nil }
		e := outbox.New(Note{Text: "nowhere"})
		expectSchemaError(t, "Idempotent", f.Idempotent(h, nil)(ctx, e))
		expectSchemaError(t, "IdempotentOneEventPerTransaction", f.Idempotent(h, oneEventPerTransaction)(ctx, e))
		expectSchemaError(t, "SkipSeen", f.SkipSeen(func(context.Context, outbox.Event[Note]) error { return nil })(ctx, e))
		if ran {
			t.Error("a handler ran although its event could not be recorded in the inbox")
		}
		_, err := f.Inbox.Seen(ctx, idempotency.Key{Consumer: "unmigrated", EventID: e.ID})
		expectSchemaError(t, "Inbox.Seen", err)
		_, err = f.PruneInbox(ctx, time.Hour, 10)
		expectSchemaError(t, "PruneInbox", err)
		expectSchemaError(t, "DeadLetters.Add", f.DeadLetters.Add(ctx, deadletter.Entry{
			Message: mustEncode(t, e), Stage: deadletter.StageConsumer, Consumer: "unmigrated", Reason: "r", Attempts: 1}))
	})

	// The handler publishes through its transaction while the outbox table is locked; the
	// database then drops the connection under the waiting statement.
	t.Run("DroppedConnectionInAHandlerIsUnavailable", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if f.SQL == nil || f.SQL.Lock == nil {
			t.Skip("the fixture cannot drop a connection (SQLite has none)")
		}
		ctx := consumer.WithInfo(context.Background(), consumer.Info{Consumer: "dropped", Attempt: 1})
		for name, wrap := range map[string]func(idempotency.TxHandler[TTx, Note]) consumer.Handler[Note]{
			"Idempotent": func(h idempotency.TxHandler[TTx, Note]) consumer.Handler[Note] {
				return f.Idempotent(h, nil)
			},
			"IdempotentOneEventPerTransaction": func(h idempotency.TxHandler[TTx, Note]) consumer.Handler[Note] {
				return f.Idempotent(h, oneEventPerTransaction)
			},
		} {
			h := wrap(func(ctx context.Context, tx TTx, e outbox.Event[Note]) error {
				return f.Publish(ctx, tx, outbox.New(Note{Text: "follow-up"}))
			})
			err := f.SQL.dropUnderLock(t, name+"'s statement", func() error { return h(ctx, outbox.New(Note{Text: name})) })
			if !outbox.IsUnavailable(err) || errors.Is(err, outbox.ErrSchema) {
				t.Errorf("%s whose connection was dropped: %v, want an error for which outbox.IsUnavailable is true", name, err)
			}
		}
	})
}
