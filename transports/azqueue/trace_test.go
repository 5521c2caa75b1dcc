package outboxazqueue_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// TestTrace: through Azurite, one trace from the request that published an event to its
// handler, the trace context riding in the structured CloudEvent's traceparent
// (oteltest.ExerciseTrace).
func TestTrace(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	queue := newQueue(t, client)
	sender, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: queue})
	if err != nil {
		t.Fatal(err)
	}
	receiver, err := outboxazqueue.NewReceiver(client.NewQueueClient(queue), fastReceiver)
	if err != nil {
		t.Fatal(err)
	}
	p := pgxtest.New(t, "outboxazqueue_trace")
	oteltest.ExerciseTrace(t, &oteltest.TraceFixture{PipelineFixture: p.Pipeline(t, sender, receiver)})
}
