package sqlstore

import (
	"context"
	"fmt"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Publish encodes events and inserts them through q, the caller's transaction: the whole of
// a Publish call for adapters whose dialect SQL needs no driver-specific fast path. An event
// that cannot be encoded fails before any SQL runs.
func Publish(ctx context.Context, d Dialect, q Querier, n *Names, events []outbox.Encodable) error {
	msgs, err := outboxdriver.Encode(ctx, events)
	if err != nil || len(msgs) == 0 {
		return err
	}
	immediate, err := PublishScheduled(ctx, d, q, n, msgs)
	if err == nil && len(immediate) > 0 {
		err = d.Insert(ctx, q, n, immediate)
	}
	if err != nil {
		return fmt.Errorf("publishing %d event(s) to %s: %w", len(msgs), n.Outbox, Classify(err, n))
	}
	return nil
}
