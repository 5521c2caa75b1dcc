package outboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// A Sender produces events (the relay calls Send; here it is called directly), and a
// Receiver of the consumer group "shipping" reads them back in order per key. The cluster
// is franz-go's in-process kfake; give real brokers to kgo.SeedBrokers instead.
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := kgo.SeedBrokers(cluster.ListenAddrs()...)

	producer, err := kgo.NewClient(brokers, kgo.ProducerLinger(0))
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	// Topics are usually created by infrastructure code.
	if _, err := kadm.NewClient(producer).CreateTopic(ctx, 6, -1, nil, "orders"); err != nil {
		log.Fatal(err)
	}
	sender, err := outboxkafka.NewSender(producer, &outboxkafka.SenderConfig{Topic: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	var msgs []outbox.Message
	for seq := range 3 {
		m, err := outbox.New(orderPlaced{Customer: "alice", Seq: seq}, outbox.WithKey("alice")).Encode()
		if err != nil {
			log.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if err := sender.Send(ctx, msgs); err != nil {
		log.Fatal(err)
	}

	receiver, err := outboxkafka.NewReceiver(&outboxkafka.ReceiverConfig{Group: "shipping", Topics: []string{"orders"}}, brokers)
	if err != nil {
		log.Fatal(err)
	}
	defer receiver.Close()
	for handled := 0; handled < len(msgs); {
		deliveries, err := receiver.Receive(ctx, 10)
		if err != nil {
			log.Fatal(err)
		}
		for _, d := range deliveries {
			m, err := d.Message()
			if errors.Is(err, outbox.ErrMalformed) {
				_ = d.Ack(ctx) // not a txoutbox event; the consumer runtime dead-letters these
				continue
			}
			e, err := outbox.Decode[orderPlaced](m)
			if err != nil {
				_ = d.Nack(ctx, time.Second)
				continue
			}
			fmt.Printf("%s's order #%d (attempt %d)\n", e.Key, e.Payload.Seq, d.Attempt())
			_ = d.Ack(ctx) // the group's offset moves once every earlier record is acked too
			handled++
		}
	}
	// Output:
	// alice's order #0 (attempt 1)
	// alice's order #1 (attempt 1)
	// alice's order #2 (attempt 1)
}

// Routing: a few event types to their own topics, the rest to a default topic.
func ExampleSenderConfig_routes() {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:9092")) // connects lazily
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	sender, err := outboxkafka.NewSender(cl, &outboxkafka.SenderConfig{
		Topic:  "shop-events",
		Routes: map[string]string{"orders.placed": "orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, typ := range []string{"orders.placed", "carts.abandoned"} {
		topic, _ := sender.TopicFor(outbox.Message{Type: typ})
		fmt.Println(typ, "→", topic)
	}
	// Output:
	// orders.placed → orders
	// carts.abandoned → shop-events
}
