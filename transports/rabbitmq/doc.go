// Package outboxrabbitmq is the RabbitMQ transport of txoutbox, built on amqp091-go (AMQP
// 0-9-1). It is for application developers whose broker is RabbitMQ.
//
// A [Sender] publishes the relay's batches to an exchange with publisher confirms: every
// message is persistent and mandatory, and counts as delivered only once the broker
// confirmed it. A message the broker nacks, returns as unroutable (no queue bound for its
// routing key) or never confirms (the connection dropped) fails, and the relay retries it.
// The routing key is the event type by default ([SenderConfig] routes differently); the
// message-id property is the event ID (outbox.Message.DedupID: a replayed dead letter gets a
// fresh one). RabbitMQ does not deduplicate: a relay's re-send after a crash is a second
// copy, which the consumer's inbox (outboxpgx.Idempotent…) absorbs.
//
// Messages travel as CloudEvents 1.0 in the binary mode of the CloudEvents AMQP binding:
// the attributes are application properties (AMQP 0-9-1 headers) named with the
// "cloudEvents_" prefix (cloudEvents_id, cloudEvents_type, cloudEvents_source,
// cloudEvents_time, cloudEvents_specversion, cloudEvents_partitionkey…), datacontenttype is
// the content-type property, and the body is the payload. The binding allows "cloudEvents:"
// too, but says "cloudEvents_" SHOULD be preferred: JMS selectors and other tools cannot
// name a ':'. Attribute values are strings (the binding's canonical form: 0-9-1 timestamps
// keep whole seconds only, so cloudEvents_time is an RFC 3339 string); receivers also accept
// native AMQP values and the "cloudEvents:" prefix (earlier versions of this transport, and
// other producers, write it), the underscore spelling winning where a message has both.
//
// A [Receiver] consumes a quorum queue with manual acknowledgements and a prefetch window.
// Attempt is the queue's delivery count (x-delivery-count) plus the attempts the message
// had before going through a retry queue (the [AttemptsHeader]). Nack with a delay sends a
// copy to a retry queue — a quorum queue whose per-queue TTL is the delay and whose
// dead-letter target is the main queue — waits for the broker's confirm, then acks the
// original; the copy returns to the main queue when its TTL expires. Delays round up to
// the retry queues' delays ([DefaultRetryDelays]: 1s, 5s, 30s, 2m, 10m, 1h). After
// MaxAttempts the consumer runtime writes the dead letter and acks.
//
// Per-key order: a plain queue hands messages to several consumers and retries send a
// message around later ones, so order holds only per key among what one consumer
// received and handled at the first attempt. For strict per-key order declare the queue
// Ordered ([Topology].Ordered: a single-active-consumer classic queue) and set
// [ReceiverConfig].Ordered: one message in flight, and a retried message is held by the
// receiver and handed out again rather than sent around (a RabbitMQ 3.x quorum queue
// requeues at the back, which is why the ordered queue is classic: what a lost consumer
// left unacknowledged goes back in place). That is the whole queue's throughput in one
// consumer at a time;
// to scale out, split keys over several ordered queues (one binding and one Receiver per
// queue, routed by a [SenderConfig].RoutingKey that hashes the event key).
//
// Creating the exchange and queues is the application's job (or its infrastructure code's);
// [Declare] does it for tests, examples and small deployments. A declared [Topology]
// promises per-key order only when it is Ordered (with [ReceiverConfig].Ordered), and never
// deduplication: RabbitMQ does not deduplicate by message-id, so a relay's re-send is a
// second copy, which the consumer's inbox absorbs.
//
// Connections: each Sender and Receiver dials its own connection on first use and redials
// after a loss with a bounded backoff ([Connection]). Deliveries of a lost connection cannot
// be acked any more (the broker has requeued them; they come again, one attempt higher).
//
// Sizes are checked before sending: a body over [SenderConfig].MaxMessageBytes (16 MiB by
// default; keep it at most the broker's max_message_size) or headers over the connection's
// frame size fail with an error wrapping outbox.ErrTooLarge, which the relay dead-letters at
// once.
//
// # Outages
//
// A send that fails for reasons of the broker or the connection is the broker's fault, not
// the message's: its errors are marked with outbox.Unavailable, so the relay pauses and
// probes until the broker takes messages again, spending no message's attempts. They are:
// a dial that fails (refused, DNS, TLS, credentials, vhost), a connection or channel that
// broke or that the broker closed (a node shutting down, 403 ACCESS_REFUSED, 404 NOT_FOUND
// for an exchange that does not exist yet, 405, 506, 530, 541), a connection the broker
// blocks under a resource alarm, a nack (a queue full with overflow reject-publish, a
// quorum queue without a majority), and a confirm that did not come before the send's
// deadline. What the broker attributes to one message stays that message's: a body or
// headers over the limits (outbox.ErrTooLarge), a mandatory message returned as unroutable
// (no queue is bound for its routing key: retried, then dead-lettered), and a channel the
// broker closed over what one message carried (406 PRECONDITION_FAILED, frame errors). A
// [Receiver]'s connection and subscription errors are marked the same way.
// [Sender.Ping] (an [outbox.Pinger]) checks the connection, dialling it if needed, and the
// exchange, sending nothing: a relay with nothing left to send learns so that the broker is
// back.
//
// # Memory
//
// RabbitMQ pushes up to Prefetch unacknowledged messages to a consumer whatever their size,
// and cannot limit them by bytes. A [Receiver] therefore sizes Prefetch from
// [ReceiverConfig].MaxHeldBytes (64 MiB by default) and MaxMessageBytes, the largest body
// the queue can hold (16 MiB, RabbitMQ 4's max_message_size): 4 messages at the defaults.
// Set MaxMessageBytes to your largest message (and the broker's max_message_size to match)
// for a larger Prefetch under the same bound.
package outboxrabbitmq
