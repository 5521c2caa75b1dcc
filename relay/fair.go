package relay

import (
	"context"
	"slices"
	"sync"
)

// fairShare is a limit on how many claim → send → write-back cycles the relays of a
// [Group] run at once, shared round-robin among them: when a cycle ends, its turn goes to
// the next relay in line that waits for one, never twice in a row to a relay while another
// waits (Weight turns in a row for a relay of weight Weight). A relay with a backlog thus
// takes at most its share of the turns, however many loops it runs, and a quiet relay's
// next claim waits for at most one cycle of each relay ahead of it.
type fairShare struct {
	mu    sync.Mutex
	size  int           // the turns in all
	free  int           // turns nobody holds
	queue []*fairMember // members with waiting loops, in round-robin order
}

// fairMember is one relay's access to a fairShare.
type fairMember struct {
	share   *fairShare
	weight  int
	credit  int             // turns left in the member's current round
	held    int             // turns the member holds, for Group.State
	waiters []chan struct{} // FIFO; each gets one turn
	queued  bool
}

func newFairShare(n int) *fairShare { return &fairShare{size: n, free: n} }

// member returns the access of one relay, taking weight turns per round.
func (f *fairShare) member(weight int) *fairMember {
	return &fairMember{share: f, weight: max(weight, 1)}
}

// acquire waits for a turn; it returns false if ctx ended first (holding no turn).
func (m *fairMember) acquire(ctx context.Context) bool {
	f := m.share
	f.mu.Lock()
	if f.free > 0 && len(f.queue) == 0 {
		f.free--
		m.held++
		f.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	m.waiters = append(m.waiters, ch)
	if !m.queued {
		m.queued, m.credit = true, m.weight
		f.queue = append(f.queue, m)
	}
	f.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
	}
	f.mu.Lock()
	if i := slices.Index(m.waiters, ch); i >= 0 { // not granted: leave the line
		m.waiters = slices.Delete(m.waiters, i, i+1)
		if len(m.waiters) == 0 {
			f.dequeue(m)
		}
		f.mu.Unlock()
		return false
	}
	f.mu.Unlock()
	m.release() // granted meanwhile: pass it on
	return false
}

// release ends the member's turn: it goes to the next member in line, or back to the free
// turns.
func (m *fairMember) release() {
	f := m.share
	f.mu.Lock()
	defer f.mu.Unlock()
	m.held--
	if len(f.queue) == 0 {
		f.free++
		return
	}
	next := f.queue[0]
	ch := next.waiters[0]
	next.waiters = next.waiters[1:]
	next.held++
	next.credit--
	switch {
	case len(next.waiters) == 0:
		f.dequeue(next)
	case next.credit <= 0: // its round is over: to the back of the line
		next.credit = next.weight
		f.queue = append(f.queue[1:], next)
	}
	close(ch)
}

// dequeue takes m out of the line (f.mu held).
func (f *fairShare) dequeue(m *fairMember) {
	if i := slices.Index(f.queue, m); i >= 0 {
		f.queue = slices.Delete(f.queue, i, i+1)
	}
	m.queued = false
}

// inUse returns the turns held now, in all and by m (nil for none).
func (f *fairShare) inUse(m *fairMember) (all, mine int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m != nil {
		mine = m.held
	}
	return f.size - f.free, mine
}
