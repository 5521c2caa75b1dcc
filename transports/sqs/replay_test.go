package outboxsqs_test

import (
	"context"
	"testing"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// TestRetryDeadLetterReplay: against fauxqs, a failing handler is retried through SQS's
// visibility timeout (ApproximateReceiveCount counting attempts), dead-lettered after
// MaxAttempts, replayed through the outbox once fixed, and handled.
// On a FIFO queue the replay must not be dropped as a duplicate of the first delivery.
func TestRetryDeadLetterReplay(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(map[bool]string{false: "standard", true: "fifo"}[fifo], func(t *testing.T) {
			t.Parallel()
			testRetryDeadLetterReplay(t, fifo)
		})
	}
}

func testRetryDeadLetterReplay(t *testing.T, fifo bool) {
	c := requireSQS(t)
	p := pgxtest.New(t, "outboxsqs")
	url := newQueue(t, c, fifo)
	outboxtest.ExerciseRetryDeadLetterReplay(t, &outboxtest.PipelineFixture{
		Store: p.Store(t),
		Publish: func(ctx context.Context, events ...outbox.Encodable) error {
			p.Commit(t, events...)
			return nil
		},
		Sender:      newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url}),
		Receiver:    newReceiver(t, c, url),
		DeadLetters: p.DeadLetters(t),
	})
}
