// Package relay delivers the events committed to an outbox to a broker: it claims them from
// an adapter's store (outboxpgx.Default.NewStore…) with a lease, sends them through a
// transport's [outbox.Sender] with the event's ID as the broker's dedup ID, keeps each key's
// order, retries a message's own failures with backoff and moves what cannot be delivered
// to the dead-letter table, pauses without spending attempts while the broker or the
// database is unavailable, and traces and measures all of it with OpenTelemetry. It is for
// application developers, who run a relay inside their service; operators can run the same
// as `outbox relay`.
//
// It is for applications that run a relay in their own process:
//
//	r, err := relay.New(store, sender, nil) // nil: the documented defaults
//	go r.Run(ctx)
//
// Run as many relays as you like over one outbox. `outbox relay` (cmd/outbox) is the same
// relay as a standalone process.
package relay
