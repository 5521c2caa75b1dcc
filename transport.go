package outbox

import (
	"context"
	"time"
)

// Sender delivers messages to a broker; the relay (package relay) calls it. Transports
// implement it (outboxmemory, outboxsqs, outboxazqueue, outboxnats, outboxkafka,
// outboxrabbitmq).
//
// The relay never puts two messages with the same key in one call (unless the Sender is a
// [KeyOrderer] that keeps key order), and calls again for a key only after the previous call
// returned, so a Sender may send a batch's messages in any order and concurrently. Send returns nil when every message was delivered, a [*BatchError] naming
// the messages that failed (the others were delivered), or any other error when the whole
// batch failed. Errors that retrying cannot fix (a message over the broker's size limit)
// should be marked with [Permanent] or wrap [ErrTooLarge]: the relay dead-letters them at once.
// Senders use Message.ID as the broker's dedup ID where it has one.
type Sender interface {
	Send(ctx context.Context, msgs []Message) error
}

// KeyOrderer is an optional interface of a [Sender] whose Send keeps the order of one key's
// messages within a call. A Sender whose KeepsKeyOrder returns true promises, for every call:
// the messages of one key reach the broker in the order given, and once one of them fails,
// every later message of that key in the same call fails too (named in the [*BatchError])
// without having been sent. The relay then sends a claim's runs of one key in one call
// instead of one message of each key per call ("waves"), which is what makes a backlog of
// few keys drain as fast as a keyless one; the later messages of a failed key are given back
// without spending an attempt, as they would be with waves. A Sender that cannot keep the
// promise, or only in some configurations, returns false (or does not implement it), and a
// wrapper of a Sender forwards the wrapped Sender's answer.
type KeyOrderer interface {
	KeepsKeyOrder() bool
}

// KeepsKeyOrder reports whether s is a [KeyOrderer] that keeps key order.
func KeepsKeyOrder(s Sender) bool {
	k, ok := s.(KeyOrderer)
	return ok && k.KeepsKeyOrder()
}

// Pinger is an optional interface of a [Sender]: Ping checks that the broker answers,
// sending nothing (a round trip on the connection, or a look at the destination). A relay
// that paused for an unavailable broker probes it by sending one message; when it has none
// to send, it pings instead, so that its state (relay.Relay.State) does not stay
// "unavailable" after the broker came back just because another relay drained the outbox
// meanwhile.
// Ping returns nil when the broker answers and an error (marked [Unavailable] where that
// applies) otherwise. Without it, the relay learns the broker is back at its next send.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Describer is an optional interface of a [Sender], a [Receiver] or a [Delivery]: it names
// the broker and a message's destination in traces, metrics and logs, as the OpenTelemetry
// messaging conventions' messaging.system and messaging.destination.name. The relay asks its
// Sender; the consumer asks each Delivery, then its Receiver (a receiver reading several
// topics describes its deliveries). Every transport of this repository implements it.
// Without it, spans are named "send" and "process" and the attributes are left out.
type Describer interface {
	// MessagingSystem is the messaging.system value: "aws_sqs", "kafka", "rabbitmq",
	// "nats", "azure_queue_storage", "memory"…
	MessagingSystem() string
	// DestinationName returns where m is sent (a Sender) or where it was received from (a
	// Receiver or Delivery): the queue, topic, subject or exchange. It is called for each
	// message while telemetry is on, so it must be cheap; "" when unknown.
	DestinationName(m Message) string
}

// Receiver reads messages from a broker for a consumer.
type Receiver interface {
	// Receive waits for up to max messages. It may return fewer, or none when its wait
	// (a long poll) ended empty; it returns ctx's error once ctx is done.
	Receive(ctx context.Context, max int) ([]Delivery, error)
}

// Delivery is one received message with the broker's acknowledgement controls.
type Delivery interface {
	// Message returns the decoded envelope, or an error (wrapping [ErrMalformed]) when the
	// broker message is not a valid txoutbox/CloudEvents envelope; the consumer dead-letters
	// such a delivery instead of retrying it.
	Message() (Message, error)
	// Attempt counts deliveries of this message, 1 on the first (SQS ApproximateReceiveCount,
	// Azure DequeueCount, JetStream's delivery count).
	Attempt() int
	// Ack removes the message from the broker: it was handled (or dead-lettered).
	Ack(ctx context.Context) error
	// Nack makes the message visible again after delay, for another attempt.
	Nack(ctx context.Context, delay time.Duration) error
}
