package relay

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestFairShareRoundRobin: a freed turn goes to the next outbox in line, not to the next
// waiting loop: an outbox with two loops waiting gets one turn, then another outbox, then
// its second, where first come first served would give it two in a row.
func TestFairShareRoundRobin(t *testing.T) {
	f := newFairShare(1)
	busy, quiet := f.member(1), f.member(1)
	ctx := context.Background()
	if !busy.acquire(ctx) {
		t.Fatal("the first turn was not granted")
	}
	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	waiting := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, q := range f.queue {
			n += len(q.waiters)
		}
		return n
	}
	wait := func(m *fairMember, name string) {
		queued := waiting()
		wg.Go(func() {
			if m.acquire(ctx) {
				mu.Lock()
				got = append(got, name)
				mu.Unlock()
				m.release()
			}
		})
		deadline := time.Now().Add(5 * time.Second) // until it stands in line
		for {
			if waiting() > queued || time.Now().After(deadline) {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	wait(busy, "busy")
	wait(busy, "busy")
	wait(quiet, "quiet")
	busy.release()
	wg.Wait()
	if want := []string{"busy", "quiet", "busy"}; !slices.Equal(got, want) {
		t.Errorf("turns went to %v, want %v", got, want)
	}
	if all, _ := f.inUse(nil); all != 0 || f.free != 1 {
		t.Errorf("after every release: %d held, %d free; want 0 and 1", all, f.free)
	}
}

// TestFairShareCancelledWaiter: a loop whose context ends while it waits leaves the line
// holding nothing, and the turn goes on to the others.
func TestFairShareCancelledWaiter(t *testing.T) {
	f := newFairShare(1)
	a, b := f.member(1), f.member(1)
	if !a.acquire(context.Background()) {
		t.Fatal("the first turn was not granted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b.acquire(ctx) {
		t.Fatal("a cancelled wait was granted a turn")
	}
	a.release()
	if all, _ := f.inUse(nil); all != 0 || f.free != 1 || len(f.queue) != 0 {
		t.Errorf("after the release: %d held, %d free, %d in line; want 0, 1, 0", all, f.free, len(f.queue))
	}
}
