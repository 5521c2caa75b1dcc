package outboxazqueue_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
)

// TestTrace: through Azurite, one trace from the request that published an event to its
// handler, the trace context riding in the structured CloudEvent's traceparent
// (oteltest.ExerciseTrace).
func TestTrace(t *testing.T) {
	t.Parallel()
	sender, receiver := newQueuePair(t)
	p := pgxtest.New(t, "outboxazqueue_trace")
	oteltest.ExerciseTrace(t, &oteltest.TraceFixture{PipelineFixture: p.Pipeline(t, sender, receiver)})
}
