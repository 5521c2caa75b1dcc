package claimcheck_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/claimcheck"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// Report is a payload that can outgrow the broker's limit.
type Report struct{ Rows []string }

func (Report) EventType() string { return "reports.ready" }

// An event of almost 1 MiB over a broker that takes 64 KiB: the body goes to the blob store, the broker
// carries a reference, and the consumer's handler gets the event whole.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "claimcheck")
	defer os.RemoveAll(dir)
	store, err := claimcheck.NewDir(dir) // claimchecks3 and claimcheckazblob in production
	if err != nil {
		panic(err)
	}
	broker := outboxmemory.New(&outboxmemory.Config{MaxMessageBytes: 64 << 10})

	// The relay's side: wrap the transport's Sender (here, called directly).
	sender, err := claimcheck.NewSender(broker, &claimcheck.SenderConfig{Store: store})
	if err != nil {
		panic(err)
	}
	rows := make([]string, 1<<16)
	for i := range rows {
		rows[i] = fmt.Sprintf("row %06d", i)
	}
	m, _ := outbox.New(Report{Rows: rows}).Encode()
	if err := sender.Send(ctx, []outbox.Message{m}); err != nil {
		panic(err)
	}
	onWire := broker.Sent()[0]
	fmt.Printf("on the broker: %d bytes of body, dataref %v\n", len(onWire.Body), strings.HasPrefix(onWire.Headers["dataref"], "file://"))

	// The consumer's side: resolve references before handlers decode.
	c, _ := consumer.New(broker, &consumer.Config{Name: "reports", DeadLetters: &outboxtest.DeadLetters{}, // the adapter's table in production
		Middleware: []consumer.Middleware{claimcheck.Resolve(store)}})
	got := make(chan int, 1)
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[Report]) error {
		got <- len(e.Payload.Rows)
		return nil
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	fmt.Println("handled rows:", <-got)
	stop()
	<-done

	// Clean-up by age: once the retention has passed, a sweep deletes the blob.
	const retention = 8 * 24 * time.Hour
	n, _ := claimcheck.Sweep(ctx, store, time.Now().Add(-retention))
	fmt.Println("swept within the retention:", n)
	later := time.Now().Add(retention + time.Minute)
	n, _ = claimcheck.Sweep(ctx, store, later.Add(-retention))
	fmt.Println("swept after it:", n)
	// Output:
	// on the broker: 0 bytes of body, dataref true
	// handled rows: 65536
	// swept within the retention: 0
	// swept after it: 1
}
