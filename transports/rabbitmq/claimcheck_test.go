package outboxrabbitmq_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestClaimCheck: a 5 MiB event through RabbitMQ by reference (claimcheck), handled typed
// and exactly once, its blob swept by age; a missing blob is a blob-missing dead letter.
// (RabbitMQ takes 2 MiB as it is: with no threshold, OverTheTransportLimit sends it whole.)
func TestClaimCheck(t *testing.T) {
	t.Parallel()
	outboxtest.ExerciseClaimCheck(t, func(t *testing.T) *outboxtest.PipelineFixture {
		d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
		return pgxtest.New(t, "outboxrabbitmq").Pipeline(t, d.sender, d.receiver)
	})
}
