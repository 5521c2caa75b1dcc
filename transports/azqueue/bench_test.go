package outboxazqueue_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// BenchmarkRelayVsBareClient measures, in one run and at the same concurrency, the relay
// draining a PostgreSQL outbox into Azurite against a bare azqueue client enqueueing the same
// pre-encoded messages in a loop (the broker's own rate). Fix N for comparable numbers:
//
//	go test -run '^$' -bench RelayVsBareClient -benchtime 1000x
//
// Keep N small: Azurite's in-memory store stops answering everyone while it garbage-collects
// deleted messages, for seconds after a few thousand and minutes after ten thousand.
func BenchmarkRelayVsBareClient(b *testing.B) {
	for _, c := range []int{10} { // the Sender's default
		b.Run(fmt.Sprintf("bare/concurrency=%d", c), func(b *testing.B) {
			client := serviceClient(b)
			q := client.NewQueueClient(newQueue(b, client))
			texts := make([]string, b.N)
			for i := range texts {
				doc, err := cloudevents.ToStructured(benchEvent(i), "")
				if err != nil {
					b.Fatal(err)
				}
				texts[i] = base64.StdEncoding.EncodeToString(doc)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			var failed atomic.Int64
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // as the relay's SendTimeout bounds it
			defer cancel()
			b.ResetTimer()
			for range c {
				wg.Go(func() {
					for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
						if _, err := q.EnqueueMessage(ctx, texts[i], nil); err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			if failed.Load() > 0 {
				b.Fatalf("%d enqueues failed", failed.Load())
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
		b.Run(fmt.Sprintf("relay/concurrency=%d", c), func(b *testing.B) {
			pool, ob, schema := pgOutbox(b)
			client := serviceClient(b)
			sender, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: newQueue(b, client), Concurrency: c})
			if err != nil {
				b.Fatal(err)
			}
			relay, err := relay.New(relayStore(b, ob, pool), sender, &relay.Config{Logger: quietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			for start := 0; start < b.N; start += 1000 {
				evs := make([]outbox.Encodable, 0, 1000)
				for i := start; i < min(start+1000, b.N); i++ {
					evs = append(evs, benchEvent(i))
				}
				publish(b, pool, ob, true, evs...)
			}
			b.ResetTimer()
			for sent := 0; sent < b.N; {
				n, err := relay.RunOnce(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if n == 0 {
					b.Fatalf("outbox drained after %d of %d events", sent, b.N)
				}
				sent += n
			}
			b.StopTimer()
			var left int // a failed send would leave its event for a retry
			var lastErr *string
			if err := pool.QueryRow(context.Background(), "SELECT count(*), max(last_error) FROM "+schema+".outbox").Scan(&left, &lastErr); err != nil || left != 0 {
				b.Fatalf("%d events not delivered (%v): %v", left, err, lastErr)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func benchEvent(i int) outbox.Message {
	m, err := outbox.New(FileUploaded{N: i, Name: fmt.Sprintf("upload-%d.csv", i)}).Encode()
	if err != nil {
		panic(err)
	}
	return m
}
