package outboxkafka_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestClaimCheck: a 5 MiB event through Kafka (kfake) by reference (claimcheck), handled
// typed and exactly once, its blob swept by age; a record over max.message.bytes goes by
// reference without a threshold; a missing blob is a blob-missing dead letter.
func TestClaimCheck(t *testing.T) {
	t.Parallel()
	cluster := newCluster(t)
	outboxtest.ExerciseClaimCheck(t, func(t *testing.T) *outboxtest.PipelineFixture {
		d := newDestination(t, cluster, nil)
		return pgxtest.New(t, "outboxkafka").Pipeline(t, d.sender, d.receiver)
	})
}
