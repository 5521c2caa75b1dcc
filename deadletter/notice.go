package deadletter

import "github.com/txoutbox/outbox"

// Notice describes a message that was just written to the dead-letter table, for the
// OnDeadLetter hooks of relay.Config and consumer.Config: an application pages someone
// from there without polling the table. A hook is called once per new dead letter, after
// the row is stored, on the goroutine that stored it: it must return quickly (hand slow
// work to another goroutine) and must not panic.
type Notice struct {
	// Message is the event, as far as it could be read (a malformed broker message or an
	// unreadable outbox row may leave fields empty). Its body is the payload: log it only
	// if that is acceptable.
	Message outbox.Message
	// Stage is where it failed: StageRelay or StageConsumer.
	Stage Stage
	// Kind classifies the failure (see the Kind constants).
	Kind Kind
	// Consumer is the consumer's name (Stage "consumer").
	Consumer string
	// Reason is the error, as stored.
	Reason string
	// Attempts counts the deliveries (relay) or handler runs (consumer) made.
	Attempts int
	// Destination is the queue, topic or subject involved, when the transport names it
	// (see [outbox.Describer]).
	Destination string
}
