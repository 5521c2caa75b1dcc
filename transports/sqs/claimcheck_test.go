package outboxsqs_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// TestClaimCheck: a 5 MiB event through SQS (fauxqs) by reference (claimcheck), handled
// typed and exactly once, its blob swept by age; a message over MaxMessageBytes goes by
// reference without a threshold; a missing blob is a blob-missing dead letter. On a FIFO
// queue the relay's second send is dropped as a duplicate.
func TestClaimCheck(t *testing.T) {
	c := requireSQS(t)
	for _, fifo := range []bool{false, true} {
		t.Run(map[bool]string{false: "standard", true: "fifo"}[fifo], func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseClaimCheck(t, func(t *testing.T) *outboxtest.PipelineFixture {
				url := newQueue(t, c, fifo)
				f := pgxtest.New(t, "outboxsqs").Pipeline(t, newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url}), newReceiver(t, c, url))
				f.Dedup = fifo
				return f
			})
		})
	}
}
