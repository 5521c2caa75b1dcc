package outboxpgx

import (
	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
)

// IdempotentGroupedWithQueue is IdempotentGroupedAt that also reports how many calls wait
// in its queue (not yet taken into a batch), so tests can line calls up deterministically.
func IdempotentGroupedWithQueue[T outbox.Payload](o *Outbox, db DB, h TxHandler[T], cfg *GroupConfig) (consumer.Handler[T], func() int) {
	g := newGrouper(o, db, h, cfg)
	return g.handle, func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue)
	}
}
