package outboxnats_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// TestTrace: through JetStream, one trace from the request that published an event to its
// handler (oteltest.ExerciseTrace); the process span names the subject.
func TestTrace(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	p := pgxtest.New(t, "outboxnats_trace")
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	oteltest.ExerciseTrace(t, &oteltest.TraceFixture{PipelineFixture: p.Pipeline(t, d.sender, d.receiver)})
}
