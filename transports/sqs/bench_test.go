package outboxsqs_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// benchPayload is a 256-byte event body, the same for every path.
var benchPayload = OrderCompleted{Order: strings.Repeat("o", 220)}

// bareEntries builds what a hand-written client would send: the JSON body and the same
// attributes the Sender sends, 10 per SendMessageBatch call.
func bareEntries(n int) [][]types.SendMessageBatchRequestEntry {
	m, err := outbox.New(benchPayload).Encode()
	if err != nil {
		panic(err)
	}
	attr := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	var calls [][]types.SendMessageBatchRequestEntry
	for i := 0; i < n; i += 10 {
		var batch []types.SendMessageBatchRequestEntry
		for j := i; j < min(i+10, n); j++ {
			batch = append(batch, types.SendMessageBatchRequestEntry{
				Id:          aws.String(strconv.Itoa(j - i)),
				MessageBody: aws.String(string(m.Body)),
				MessageAttributes: map[string]types.MessageAttributeValue{
					"ce-specversion": attr("1.0"), "ce-id": attr(uuid.NewString()), "ce-type": attr(m.Type),
					"ce-source": attr("/txoutbox"), "ce-time": attr(m.CreatedAt.Format(time.RFC3339Nano)),
					"content-type": attr(m.ContentType),
				},
			})
		}
		calls = append(calls, batch)
	}
	return calls
}

// BenchmarkRelayToSQS compares, in one run, the relay draining a PostgreSQL outbox into
// SQS with the broker's own publish rate from a bare SDK loop (SendMessageBatch of 10
// messages, one call at a time and 10 calls at a time). b.N is the number of events each
// path sends; the paths take turns in rounds of 2,000 events, so load from elsewhere on the
// machine weighs on all of them alike. Run it with a fixed count:
//
//	go test -run '^$' -bench RelayToSQS -benchtime 20000x
func BenchmarkRelayToSQS(b *testing.B) {
	c := requireSQS(b)
	p := pgxtest.New(b, "outboxsqs")
	ctx := context.Background()

	// Warm the emulator up (Node's JIT) so the first path measured is not penalised.
	warm := newQueue(b, c, false)
	bareSend(b, c, warm, bareEntries(3000), 10)

	bareSeq, bareConc, relayQueue := newQueue(b, c, false), newQueue(b, c, false), newQueue(b, c, false)
	s, err := outboxsqs.NewSender(c, &outboxsqs.SenderConfig{QueueURL: relayQueue})
	if err != nil {
		b.Fatal(err)
	}
	store := p.Store(b)
	newRelay := func(name string) *relay.Relay {
		r, err := relay.New(store, s, &relay.Config{Name: name, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	relays := []*relay.Relay{newRelay("bench-a"), newRelay("bench-b")}
	drain := func(relays []*relay.Relay) {
		var wg sync.WaitGroup
		for _, r := range relays {
			wg.Go(func() {
				for {
					n, err := r.RunOnce(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					if n == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
	}
	publish := func(n int) {
		events := make([]outbox.Encodable, n)
		for i := range events {
			events[i] = outbox.New(benchPayload)
		}
		p.Commit(b, events...)
	}

	const round = 2000
	var spent [4]time.Duration // bare sequential, bare 10 concurrent, 1 relay, 2 relays
	timed := func(i int, f func()) {
		start := time.Now()
		f()
		spent[i] += time.Since(start)
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		calls := bareEntries(n)
		timed(0, func() { bareSend(b, c, bareSeq, calls, 1) })
		calls = bareEntries(n)
		timed(1, func() { bareSend(b, c, bareConc, calls, 10) })
		publish(n)
		timed(2, func() { drain(relays[:1]) })
		publish(n)
		timed(3, func() { drain(relays) })
	}
	b.StopTimer()
	if left, dead := p.Count(b, "outbox"), p.Count(b, "outbox_dead_letters"); left != 0 || dead != 0 {
		b.Fatalf("%d events left in the outbox and %d dead-lettered, want 0 and 0", left, dead)
	}
	rate := func(i int) float64 { return float64(b.N) / spent[i].Seconds() }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(rate(0), "bare-seq-ev/s")
	b.ReportMetric(rate(1), "bare-10-ev/s")
	b.ReportMetric(rate(2), "relay-ev/s")
	b.ReportMetric(rate(3), "2relays-ev/s")
	b.ReportMetric(rate(2)/max(rate(0), rate(1)), "relay/best-bare")
	b.ReportMetric(rate(3)/max(rate(0), rate(1)), "2relays/best-bare")
}

// bareSend sends calls with SendMessageBatch from workers goroutines.
func bareSend(b *testing.B, c *sqs.Client, url string, calls [][]types.SendMessageBatchRequestEntry, workers int) {
	work := make(chan []types.SendMessageBatchRequestEntry)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for entries := range work {
				out, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: entries})
				if err != nil {
					b.Error(err)
				} else if len(out.Failed) > 0 {
					b.Errorf("SendMessageBatch: %d entries failed", len(out.Failed))
				}
			}
		})
	}
	for _, entries := range calls {
		work <- entries
	}
	close(work)
	wg.Wait()
}
