package outboxsqs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// A Receive in a 20s long poll returns as soon as its context ends.
func TestReceiveHonoursContext(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	url := newQueue(t, c, true)
	r, err := outboxsqs.NewReceiver(c, &outboxsqs.ReceiverConfig{QueueURL: url})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	ds, err := r.Receive(ctx, 10)
	if !errors.Is(err, context.DeadlineExceeded) || len(ds) != 0 {
		t.Fatalf("Receive = %d deliveries, %v; want context.DeadlineExceeded", len(ds), err)
	}
	if waited := time.Since(start); waited >= outboxsqs.DefaultWaitTime {
		t.Fatalf("Receive returned after %v: it waited out the long poll instead of the context", waited)
	}
	if _, err := r.Receive(ctx, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive with a done context = %v", err)
	}
}

// Attempt counts receives (ApproximateReceiveCount), also when the delivery is left to its
// visibility timeout instead of being nacked.
func TestAttemptCountsVisibilityTimeouts(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	url := newQueue(t, c, false)
	r, err := outboxsqs.NewReceiver(c, &outboxsqs.ReceiverConfig{QueueURL: url, WaitTime: time.Second, VisibilityTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	m := message("t", "", `{}`)
	if err := s.Send(context.Background(), []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 3; want++ {
		ds := receiveWithin(t, r, 10*time.Second)
		if got, _ := ds.Message(); got.ID != m.ID || ds.Attempt() != want {
			t.Fatalf("receive %d: message %s attempt %d, want %s attempt %d", want, got.ID, ds.Attempt(), m.ID, want)
		}
		if want == 3 {
			if err := ds.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		} // else: not acked, it reappears after the 1s visibility timeout
	}
}

func receiveWithin(t *testing.T, r outbox.Receiver, timeout time.Duration) outbox.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		ds, err := r.Receive(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			return ds[0]
		}
	}
}

// Regression test for the net/http–SDK body race that withPlainBody works around: with
// receives cancelled all the time on one queue, sends and receives on another lose nothing
// (before the fix, a SendMessageBatch or ReceiveMessage was now and then retried after its
// connection was closed under it, and the lost response's messages stayed hidden for the
// 30s visibility timeout). It shows mostly under -race.
func TestNothingLostAmidCancelledReceives(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	busy := newReceiver(t, c, newQueue(t, c, false))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				_, _ = busy.Receive(ctx, 10)
				cancel()
			}
		})
	}
	for range 50 {
		url := newQueue(t, c, false)
		s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
		var msgs []outbox.Message
		for i := range 95 {
			msgs = append(msgs, message("bulk", "", fmt.Sprintf(`{"n":%d}`, i)))
		}
		if err := s.Send(context.Background(), msgs); err != nil {
			t.Fatal(err)
		}
		got := receiveIDs(t, newReceiver(t, c, url), len(msgs))
		for _, m := range msgs {
			if got[m.ID] != 1 {
				t.Fatalf("message %s received %d times, want once", m.ID, got[m.ID])
			}
		}
	}
}
