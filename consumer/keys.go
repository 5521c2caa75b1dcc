package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/telemetry"
)

// UnknownTypePolicy says what a consumer does with a message whose event type has no
// handler registered (Config.UnknownTypes).
type UnknownTypePolicy int

const (
	// DeadLetterUnknownTypes (the default) writes the message to the dead-letter table at
	// once (kind "unknown-type") and acknowledges it: a type nobody expected is a mistake
	// someone should look at, and it can be replayed once a handler exists. Pick it when
	// the consumer's stream should carry only its own types.
	DeadLetterUnknownTypes UnknownTypePolicy = iota
	// AcknowledgeUnknownTypes acknowledges the message without a dead letter, counting it
	// in txoutbox.consumer.messages (outcome "ignored", type "_OTHER") and logging it at
	// debug level. Pick it for a consumer that reads a stream shared with types meant for
	// others (and, on NATS, filter the consumer's subjects instead where you can).
	AcknowledgeUnknownTypes
	// RetryUnknownTypes nacks the message with the consumer's retry backoff (outcome
	// "no_handler", a rate-limited warning), for as long as no handler exists, and never
	// dead-letters it, whatever its attempt count. Pick it during a rolling deploy where
	// producers upgrade first: a new type waits in the broker until the consumers that
	// handle it are deployed. Mind the broker's own delivery limits (see the package
	// documentation), and that on a transport that keeps a key's order the key waits too.
	RetryUnknownTypes
)

// String names the policy.
func (p UnknownTypePolicy) String() string {
	switch p {
	case DeadLetterUnknownTypes:
		return "dead-letter"
	case AcknowledgeUnknownTypes:
		return "acknowledge"
	case RetryUnknownTypes:
		return "retry"
	}
	return fmt.Sprintf("UnknownTypePolicy(%d)", int(p))
}

// unknownType settles r, whose event type has no handler, by Config.UnknownTypes.
func (c *Consumer) unknownType(ctx context.Context, r received, attempt int, dest string) {
	m := r.m
	other := m
	other.Type = telemetry.OtherType // bounded metric cardinality, whatever arrives
	switch c.cfg.UnknownTypes {
	case AcknowledgeUnknownTypes:
		c.avail.inconclusive(r.probe)
		c.obs.settled(ctx, other, dest, telemetry.Ignored)
		c.obs.log.LogAttrs(ctx, slog.LevelDebug, "consumer: no handler for the event type; acknowledged", eventAttrs(m, attempt)...)
		if err := c.ack(ctx, r.d); err != nil {
			c.obs.logFailure(ctx, "consumer: ack of a message of an unknown type failed", m, attempt, err)
		}
	case RetryUnknownTypes:
		c.avail.inconclusive(r.probe)
		delay := backoff.Delay(attempt, c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff)
		c.obs.settled(ctx, other, dest, telemetry.NoHandler)
		c.obs.logFailure(ctx, "consumer: no handler for the event type; will retry until one is registered (UnknownTypes is RetryUnknownTypes)",
			m, attempt, fmt.Errorf("retry in %v", delay.Round(time.Millisecond)))
		if err := c.nack(ctx, r.d, delay); err != nil {
			c.obs.logFailure(ctx, "consumer: nack failed; the message reappears after its visibility timeout", m, attempt, err)
		}
	default:
		c.deadLetter(ctx, r, deadletter.Entry{Message: m, Kind: deadletter.KindUnknownType,
			Reason: fmt.Sprintf("no handler for event type %q", m.Type)}, attempt, dest)
	}
}

// holdKey dead-letters r (kind "held") and reports true when its key is held by a
// dead letter of this consumer (Config.HoldKeys; see deadletter.KeyHolds for the rule). A
// lookup that fails is an unavailable dead-letter table: r is nacked, never handled
// without the answer.
func (c *Consumer) holdKey(ctx context.Context, r received, attempt int, dest string) bool {
	m := r.m
	id, err := c.cfg.DeadLetters.(deadletter.KeyHolds).HeldBy(ctx, c.cfg.Name, m.Key, m.ID, m.CreatedAt)
	switch {
	case err != nil && ctx.Err() != nil:
		c.avail.inconclusive(r.probe)
		return true // shutting down: left to redelivery
	case err != nil:
		c.unavailable(ctx, r, dest, fmt.Errorf("consumer: looking up whether key %q is held: %w", m.Key, err))
		return true
	case id == 0:
		return false
	}
	c.deadLetter(ctx, r, deadletter.Entry{Message: m, Kind: deadletter.KindHeld,
		Reason: fmt.Sprintf("key %q is held by dead letter %d of consumer %q (HoldKeys): replay or discard that entry, then this one", m.Key, id, c.cfg.Name)}, attempt, dest)
	return true
}
