// Package outboxnats is the NATS JetStream transport of txoutbox, built on nats.go's
// jetstream package. It is for application developers whose broker is NATS JetStream;
// docs/transports/nats.md walks through the subject and stream set-up.
//
// A [Sender] publishes the relay's batches asynchronously, up to MaxPending at once, and
// waits for every publish acknowledgement, so a message counts as delivered only once the
// stream has stored it. It speaks JetStream's publish protocol itself (a reply subject per
// message, read on one subscription per Sender) rather than through nats.go's
// PublishMsgAsync, whose per-message bookkeeping cost more CPU than the publish.
//
// Each message carries its event ID in the Nats-Msg-Id header (outbox.Message.DedupID: a
// replayed dead letter gets a fresh one): the stream's duplicate window drops a re-send (a relay that crashed between publishing and deleting the outbox
// row), and the publish acknowledgement says Duplicate. Keep the stream's Duplicates window
// (server default 2 minutes) longer than the relay's Lease plus its SendTimeout, the longest
// time before a crashed relay's messages are sent again. A re-send after the window (a
// retry after a long backoff) is stored again; the consumer's inbox absorbs it.
//
// Messages travel as CloudEvents 1.0 in binary mode: the attributes are NATS headers
// (ce-id, ce-type, ce-source, ce-time, ce-specversion, ce-partitionkey, content-type…) and
// the body is the payload, so a consumer in any language reads them with its CloudEvents
// SDK. Each event type goes to a subject: by default "events." followed by the type
// ("events.orders.created"); see [SenderConfig] to route differently.
//
// A stream usually captures every subject under the prefix ("events.>"), shared by all
// event types. A consumer that handles only some of them can receive only those: give its
// durable consumer the subjects they are published to as filters ([Topology].FilterSubjects,
// built by [SubjectsFor] from the event types and the Sender's routing, so the two agree).
// One filter subject works on every nats-server with JetStream ("events.orders.>" covers a
// family of types); several need nats-server 2.10 or later. Without filters, the consumer
// runtime's Config.UnknownTypes decides what becomes of the other types.
//
// A [Receiver] reads through a durable pull consumer with explicit acks. Attempt is the
// consumer's delivery count; Ack waits for the server to confirm it (JetStream's double
// ack) unless [ReceiverConfig].AsyncAck is set; Nack is a negative ack with a delay.
// Creating streams and consumers is the application's job (or its infrastructure code's);
// [Provision] does it for tests, examples and small deployments. What a stream and consumer
// promise follows from their configuration: per-key order, retries included, only from a
// consumer with MaxAckPending 1 and explicit acks ([Topology].Ordered), since with several
// messages in flight a later one overtakes one being retried; deduplication by event ID
// while the stream has a Duplicates window (the server's default is 2 minutes).
//
// Sizes are checked before sending: a message whose headers and body exceed the server's
// max_payload (or a lower limit set in [SenderConfig]) fails with an error wrapping
// outbox.ErrTooLarge, which the relay dead-letters at once.
//
// # Outages
//
// A send that fails for reasons of the server, the stream or the connection is the
// broker's fault, not the message's: its errors are marked with outbox.Unavailable, so the
// relay pauses and probes until the server takes messages again, spending no message's
// attempts. They are: a connection that is disconnected, reconnecting, closed or stale;
// no responders (no stream captures the subject yet, or the stream has no leader, after
// two retries 250 ms apart); no publish acknowledgement within the send's deadline;
// authorization errors; JetStream not enabled; a stream that does not exist; and every
// JetStream API error with a 5xx status (a full stream that discards new messages, no
// quorum, insufficient resources, a stream offline) or the account's storage limit. What
// the stream refuses in one message is that message's: over the server's max_payload or
// the stream's max_msg_size (outbox.ErrTooLarge), headers over 64 KiB, a subject of
// another stream than [SenderConfig].Stream. A [Receiver]'s pull errors are marked the
// same way. [Sender.Ping] (an [outbox.Pinger]) asks for the stream's info (or the
// account's), sending nothing: a relay with nothing left to send learns so that the server
// is back.
//
// # Memory
//
// A [Receiver] holds at most [ReceiverConfig].MaxHeldBytes (64 MiB by default) of messages
// handed out and not yet settled: its pulls ask the server for no more than what is left,
// and a full receiver waits for a delivery to settle before it pulls again.
package outboxnats
