package outboxazqueue_test

import (
	"context"
	"testing"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// TestRetryDeadLetterReplay: against Azurite, a failing handler is retried through the
// message's visibility timeout (DequeueCount counting attempts), dead-lettered after
// MaxAttempts, replayed through the outbox once fixed, and handled.
func TestRetryDeadLetterReplay(t *testing.T) {
	t.Parallel()
	pool, ob, _ := pgOutbox(t)
	sender, receiver := newQueuePair(t)
	outboxtest.ExerciseRetryDeadLetterReplay(t, &outboxtest.PipelineFixture{
		Store: relayStore(t, ob, pool),
		Publish: func(ctx context.Context, events ...outbox.Encodable) error {
			publish(t, pool, ob, true, events...)
			return nil
		},
		Sender:      sender,
		Receiver:    receiver,
		DeadLetters: deadLetters(t, ob, pool),
	})
}

// newQueuePair creates a fresh queue and returns a sender to it and a fast receiver of it.
func newQueuePair(t testing.TB) (*outboxazqueue.Sender, *outboxazqueue.Receiver) {
	t.Helper()
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
	return sender, receiver
}
