package consumer_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/internal/benchtest"
)

// BenchmarkRun measures the consumer runtime itself: receiving from a receiver that hands
// out ready deliveries and acknowledges for free, decoding, dispatching and settling, with
// Concurrency 32 and batches of 32. The handlers do nothing ("noop") or call down a deep
// stack, as a database driver does ("deep-stack": 16 KiB of frames), which costs a
// goroutine that starts with a small stack a copy on every delivery. Keys: none, or 100
// distinct ones (per-key order). Reported per event: ns, bytes and allocations.
//
//	go test -run '^$' -bench BenchmarkRun -benchmem ./consumer
func BenchmarkRun(b *testing.B) {
	handlers := []struct {
		name string
		h    consumer.Handler[Paid]
	}{
		{"noop", func(context.Context, outbox.Event[Paid]) error { return nil }},
		{"deep-stack", func(_ context.Context, e outbox.Event[Paid]) error {
			if deep(64, e.Payload.Order) < 0 {
				return outbox.Permanent(nil)
			}
			return nil
		}},
	}
	for _, h := range handlers {
		for _, keys := range []int{0, 100} {
			b.Run(h.name+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
				msgs := make([]outbox.Message, b.N)
				for i := range msgs {
					var opts []outbox.Option
					if keys > 0 {
						opts = append(opts, outbox.WithKey("k"+strconv.Itoa(i%keys)))
					}
					m, err := outbox.New(Paid{Order: i}, opts...).Encode()
					if err != nil {
						b.Fatal(err)
					}
					msgs[i] = m
				}
				r := benchtest.NewReadyReceiver(msgs)
				c, err := consumer.New(r, &consumer.Config{Name: "bench", DeadLetters: &memoryDLQ{}, Concurrency: 32, BatchSize: 32})
				if err != nil {
					b.Fatal(err)
				}
				consumer.Handle(c, h.h)
				ctx, cancel := context.WithCancel(context.Background())
				ran := make(chan error)
				b.ReportAllocs()
				b.ResetTimer()
				go func() { ran <- c.Run(ctx) }()
				r.Wait()
				b.StopTimer()
				cancel()
				if err := <-ran; err != nil {
					b.Fatal(err)
				}
				if n := r.Acked(); n != int64(b.N) {
					b.Fatalf("%d acked, want %d", n, b.N)
				}
			})
		}
	}
}

// deep uses about 256 bytes of stack per level.
//
//go:noinline
func deep(level, x int) int {
	var pad [32]int
	pad[x%32] = x
	if level == 0 {
		return pad[0]
	}
	return deep(level-1, x+1) + pad[level%32]
}
