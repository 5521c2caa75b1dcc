package cloudevents_test

import (
	"fmt"

	"github.com/txoutbox/outbox/cloudevents"
)

// A CloudEvent written by another producer (here as the JavaScript SDK's HTTP binding writes
// it) with an id that is not a UUID: it gets a stable event ID, keeps its id, source and
// subject in headers, and goes back out as the same CloudEvent.
func ExampleFromBinary() {
	m, err := cloudevents.FromBinary(map[string]string{
		"content-type":    "application/json; charset=utf-8",
		"ce-specversion":  "1.0",
		"ce-id":           "order-42-created",
		"ce-source":       "/shop/orders",
		"ce-type":         "shop.order.created",
		"ce-time":         "2026-11-22t10:00:00.123z",
		"ce-subject":      "order-42",
		"ce-partitionkey": "order-42",
		"ce-retrycount":   "3",
	}, []byte(`{"order":42}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(m.ID, m.ID == cloudevents.EventID("/shop/orders", "order-42-created"))
	fmt.Println(m.Type, m.Key, m.CreatedAt)
	fmt.Println(m.Headers[cloudevents.IDHeader], m.Headers[cloudevents.SourceHeader], m.Headers[cloudevents.SubjectHeader], m.Headers["retrycount"])

	h, err := cloudevents.ToBinary(m, "/our-relay")
	if err != nil {
		panic(err)
	}
	fmt.Println(h["ce-id"], h["ce-source"], h["ce-subject"])
	// Output:
	// ec3963a6-24fa-5a86-8599-1908de144d09 true
	// shop.order.created order-42 2026-11-22 10:00:00.123 +0000 UTC
	// order-42-created /shop/orders order-42 3
	// order-42-created /shop/orders order-42
}

// A transport reports a message that is not a valid event with everything it received.
func ExampleMalformed() {
	headers := map[string]string{"ce-specversion": "1.0", "ce-type": "shop.order.created", "ce-partitionkey": "order-42"}
	body := []byte(`{"order":42}`)
	_, err := cloudevents.FromBinary(headers, body)
	me := cloudevents.Malformed(err, "stream ORDERS seq 7", headers, body)
	fmt.Println(me)
	fmt.Println(me.Partial.Type, me.Partial.Key, string(me.Body))
	// Output:
	// outbox: malformed message: broker message stream ORDERS seq 7: not a valid CloudEvent: no id
	// shop.order.created order-42 {"order":42}
}
