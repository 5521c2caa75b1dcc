package outboxsqs_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// TestTrace: through fauxqs, standard and FIFO queues, one trace from the request that
// published an event to its handler, with the messaging conventions' spans and attributes
// (oteltest.ExerciseTrace).
func TestTrace(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(map[bool]string{false: "standard", true: "fifo"}[fifo], func(t *testing.T) {
			t.Parallel()
			c := requireSQS(t)
			url := newQueue(t, c, fifo)
			p := pgxtest.New(t, "outboxsqs_trace")
			f := p.Pipeline(t, newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url}), newReceiver(t, c, url))
			oteltest.ExerciseTrace(t, &oteltest.TraceFixture{PipelineFixture: f})
		})
	}
}
