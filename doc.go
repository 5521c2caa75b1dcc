// Package outbox is the front door of txoutbox, a transactional outbox for Go.
//
// An application writes typed events ([Event]) into an outbox table inside its own database
// transaction, through the adapter for the driver it already uses (outboxpgx, outboxgorm,
// outboxbun, outboxsql). A [Relay] delivers committed events to a broker through a [Sender]
// (outboxmemory, outboxsqs, outboxazqueue, outboxnats) with the event's ID as the broker's dedup ID,
// retrying with backoff and moving what cannot be delivered to the dead-letter table.
//
// The README (https://github.com/txoutbox/outbox) is the tour; the topic pages are in its docs
// directory: delivery guarantees (docs/delivery.md), ordering (docs/ordering.md), dead
// letters (docs/deadletters.md) and operating it (docs/operating.md), at
// https://github.com/txoutbox/outbox/tree/main/docs.
package outbox
