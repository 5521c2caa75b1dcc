package outboxkafka_test

import (
	"testing"
	"time"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
)

// TestTrace: through Kafka (kfake), one trace from the request that published an event to
// its handler (oteltest.ExerciseTrace); the process span names the record's topic.
func TestTrace(t *testing.T) {
	t.Parallel()
	p := pgxtest.New(t, "outboxkafka_trace")
	d := newDestination(t, newCluster(t), nil)
	f := p.Pipeline(t, d.sender, d.receiver)
	f.RetryBackoff = 100 * time.Millisecond
	oteltest.ExerciseTrace(t, &oteltest.TraceFixture{PipelineFixture: f})
}
