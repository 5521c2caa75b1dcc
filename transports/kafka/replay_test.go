package outboxkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestRetryDeadLetterReplay: on Kafka, a failing handler is retried through the receiver's
// delayed redelivery (its attempt count growing), dead-lettered after MaxAttempts while the
// other event flows, replayed through the outbox once fixed, and handled.
func TestRetryDeadLetterReplay(t *testing.T) {
	t.Parallel()
	p := pgxtest.New(t, "outboxkafka")
	d := newDestination(t, newCluster(t), nil)
	outboxtest.ExerciseRetryDeadLetterReplay(t, &outboxtest.PipelineFixture{
		Store: p.Store(t),
		Publish: func(ctx context.Context, events ...outbox.Encodable) error {
			p.Commit(t, events...)
			return nil
		},
		Sender:       d.sender,
		Receiver:     d.receiver,
		DeadLetters:  p.DeadLetters(t),
		RetryBackoff: 500 * time.Millisecond,
	})
}
