package outboxrabbitmq_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestTrace: through RabbitMQ, one trace from the request that published an event to its
// handler (oteltest.ExerciseTrace): sent to the exchange, processed from the queue.
func TestTrace(t *testing.T) {
	t.Parallel()
	p := pgxtest.New(t, "outboxamqp_trace")
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	oteltest.ExerciseTrace(t, &oteltest.TraceFixture{PipelineFixture: p.Pipeline(t, d.sender, d.receiver),
		ProcessDestination: d.top.Queue})
}
