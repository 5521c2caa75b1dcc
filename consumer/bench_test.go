package consumer_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
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
				r := &readyReceiver{msgs: msgs}
				r.done.Add(b.N)
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
				r.done.Wait()
				b.StopTimer()
				cancel()
				if err := <-ran; err != nil {
					b.Fatal(err)
				}
				if n := r.acked.Load(); n != int64(b.N) {
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

// readyReceiver hands out msgs in order; its deliveries acknowledge at no cost.
type readyReceiver struct {
	msgs  []outbox.Message
	next  atomic.Int64
	acked atomic.Int64
	done  sync.WaitGroup
}

func (r *readyReceiver) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	end := r.next.Add(int64(limit))
	start := end - int64(limit)
	if start >= int64(len(r.msgs)) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	end = min(end, int64(len(r.msgs)))
	ds := make([]outbox.Delivery, 0, end-start)
	for i := start; i < end; i++ {
		ds = append(ds, &readyDelivery{r: r, m: &r.msgs[i]})
	}
	return ds, nil
}

type readyDelivery struct {
	r *readyReceiver
	m *outbox.Message
}

func (d *readyDelivery) Message() (outbox.Message, error) { return *d.m, nil }
func (d *readyDelivery) Attempt() int                     { return 1 }
func (d *readyDelivery) Ack(context.Context) error {
	d.r.acked.Add(1)
	d.r.done.Done()
	return nil
}
func (d *readyDelivery) Nack(context.Context, time.Duration) error { return nil }
