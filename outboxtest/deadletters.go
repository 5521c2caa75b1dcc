package outboxtest

import (
	"context"
	"sync"

	"github.com/txoutbox/outbox/deadletter"
)

// DeadLetters is a deadletter.Writer that keeps what it is given in memory: the dead-letter
// table of a consumer under test, where the SQL tables are beside the point (they are
// tested with each adapter). Safe for concurrent use.
type DeadLetters struct {
	mu      sync.Mutex
	entries []deadletter.Entry
}

// Add implements deadletter.Writer.
func (d *DeadLetters) Add(_ context.Context, e deadletter.Entry) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries = append(d.entries, e)
	return nil
}

// Entries returns a copy of what was added, in order.
func (d *DeadLetters) Entries() []deadletter.Entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]deadletter.Entry(nil), d.entries...)
}
