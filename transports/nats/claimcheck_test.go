package outboxnats_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// TestClaimCheck: a 5 MiB event through JetStream by reference (claimcheck), handled typed
// and exactly once, its blob swept by age; a message over max_payload goes by reference
// without a threshold; a missing blob is a blob-missing dead letter.
func TestClaimCheck(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	outboxtest.ExerciseClaimCheck(t, func(t *testing.T) *outboxtest.PipelineFixture {
		d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
		f := pgxtest.New(t, "outboxnats").Pipeline(t, d.sender, d.receiver)
		f.Dedup = true // Nats-Msg-Id within the stream's duplicate window
		return f
	})
}
