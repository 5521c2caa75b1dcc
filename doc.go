// Package outbox is what every user of txoutbox shares, a transactional outbox for Go:
// typed events ([Event], [New] and its options), the messages they are encoded to and their
// codecs, the errors callers branch on ([Permanent], [Unavailable], [ErrSchema]…), the names
// of an outbox's tables ([Tables]), and the contracts of transports ([Sender], [Receiver],
// [Delivery]). Application developers use all of it; authors of transports implement its
// contracts (and the optional [Pinger] and [Describer]); authors of stores start at package
// outboxdriver.
//
// An application writes events into an outbox table inside its own database transaction,
// through the adapter for the driver it already uses (outboxpgx, outboxgorm, outboxbun,
// outboxsql). The relay (package relay, or the standalone `outbox relay`) delivers committed
// events to a broker through a transport (outboxsqs, outboxazqueue, outboxnats, outboxkafka,
// outboxrabbitmq, outboxmemory) with the event's ID as the broker's dedup ID; package
// consumer runs typed handlers on the other side, exactly once through the inbox of package
// idempotency; what cannot be delivered or handled waits in the dead-letter table of package
// deadletter. Authors of a store for another database implement package outboxdriver.
//
// The README (https://github.com/txoutbox/outbox) is the tour; the topic pages are in its docs
// directory: delivery guarantees (docs/delivery.md), ordering (docs/ordering.md), dead
// letters (docs/deadletters.md) and operating it (docs/operating.md), at
// https://github.com/txoutbox/outbox/tree/main/docs.
package outbox
