package outbox

// DeadLettered describes a message that was just written to the dead-letter table, for the
// OnDeadLetter hooks of [RelayConfig] and consumer.Config: an application pages someone
// from there without polling the table. A hook is called once per new dead letter, after
// the row is stored, on the goroutine that stored it: it must return quickly (hand slow
// work to another goroutine) and must not panic.
type DeadLettered struct {
	// Message is the event, as far as it could be read (a malformed broker message or an
	// unreadable outbox row may leave fields empty). Its body is the payload: log it only
	// if that is acceptable.
	Message Message
	// Stage is "relay" or "consumer" (deadletter.StageRelay, deadletter.StageConsumer).
	Stage string
	// Kind classifies the failure: a deadletter.Kind value ("gave-up", "permanent",
	// "too-large", "unreadable-row", "malformed", "unknown-type", "undecodable").
	Kind string
	// Consumer is the consumer's name (Stage "consumer").
	Consumer string
	// Reason is the error, as stored.
	Reason string
	// Attempts counts the deliveries (relay) or handler runs (consumer) made.
	Attempts int
	// Destination is the queue, topic or subject involved, when the transport names it
	// (see [Describer]).
	Destination string
}
