package outboxnats_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// TestRetryDeadLetterReplay: against JetStream, a failing handler is retried through
// NakWithDelay (the delivery count counting attempts), dead-lettered after MaxAttempts,
// replayed through the outbox once fixed, and handled.
func TestRetryDeadLetterReplay(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	p := pgxtest.New(t, "outboxnats")
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	outboxtest.ExerciseRetryDeadLetterReplay(t, &outboxtest.PipelineFixture{
		Store: p.Store(t),
		Publish: func(ctx context.Context, events ...outbox.Encodable) error {
			p.Commit(t, events...)
			return nil
		},
		Sender:      d.sender,
		Receiver:    d.receiver,
		DeadLetters: p.DeadLetters(t),
	})
}
