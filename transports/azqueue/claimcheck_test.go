package outboxazqueue_test

import (
	"testing"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestClaimCheck: a 5 MiB event through Azure Queue Storage (Azurite) by reference
// (claimcheck), handled typed and exactly once, its blob swept by age; a message over the
// 64 KiB limit goes by reference without a threshold (the Sender declares its limit); a
// missing blob is a blob-missing dead letter.
func TestClaimCheck(t *testing.T) {
	t.Parallel()
	outboxtest.ExerciseClaimCheck(t, func(t *testing.T) *outboxtest.PipelineFixture {
		sender, receiver := newQueuePair(t)
		return pgxtest.New(t, "outboxazqueue").Pipeline(t, sender, receiver)
	})
}
