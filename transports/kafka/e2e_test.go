package outboxkafka_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// TestEndToEnd: orders committed in PostgreSQL go outbox → two relays → Kafka (three
// brokers, six partitions) → two consumers of one group, whose handler writes an effect
// through the inbox. Every committed order takes effect exactly once, each customer's
// orders in commit order; an order whose transaction rolled back never does.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	d := newDestination(t, c, nil)
	pl := newPipeline(t)

	stopRelays := []func(){run(t, pl.relay("relay-1", d.sender).Run), run(t, pl.relay("relay-2", d.sender).Run)}
	r2 := newReceiver(t, c, outboxkafka.ReceiverConfig{Group: "billing-" + d.topic, Topics: []string{d.topic}, MaxWait: 200 * time.Millisecond})
	r1 := newReceiver(t, c, outboxkafka.ReceiverConfig{Group: "billing-" + d.topic, Topics: []string{d.topic}, MaxWait: 200 * time.Millisecond})
	stopConsumers := []func(){run(t, pl.consumer(r1).Run), run(t, pl.consumer(r2).Run)}

	for i := range 40 {
		var customers []string
		for k := range 1 + i%8 {
			customers = append(customers, fmt.Sprintf("customer-%d", (i+k)%12))
		}
		pl.commit(customers...)
	}
	rolledBack := outbox.New(orderPlaced{Customer: "never", Seq: 0}, outbox.WithKey("never"))
	tx, err := pl.p.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.p.Outbox.Publish(context.Background(), tx, rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}

	pl.awaitSettled(60 * time.Second)
	for _, stop := range append(stopRelays, stopConsumers...) {
		stop()
	}
	pl.verify()
}
