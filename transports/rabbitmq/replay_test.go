package outboxrabbitmq_test

import (
	"context"
	"testing"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestRetryDeadLetterReplay: against RabbitMQ, a failing handler is retried through the
// retry queues (the attempt counted across them), dead-lettered after MaxAttempts,
// replayed through the outbox once fixed, and handled.
func TestRetryDeadLetterReplay(t *testing.T) {
	t.Parallel()
	p := pgxtest.New(t, "outboxrabbitmq")
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
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
