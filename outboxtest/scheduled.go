package outboxtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// exerciseScheduled checks scheduled events (outbox.WithDeliverAt): never sent before their
// time, sent after it; Cancel before the time takes them back (and says so), after it or
// twice says false; a rolled-back Publish or Cancel changes nothing; a keyed scheduled event
// takes its place in its key's order when it falls due, behind the key's events published
// before, without holding them back before.
func exerciseScheduled(t *testing.T, newFixture func(t *testing.T) *StoreFixture) {
	t.Run("Scheduled", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if f.Cancel == nil {
			t.Skip("the fixture has no Cancel: the store does not schedule events")
		}
		ctx := context.Background()
		const wait = 1500 * time.Millisecond
		first := outbox.New(Note{Text: "first"}, outbox.WithKey("acct"))
		scheduled := outbox.New(Note{Text: "scheduled"}, outbox.WithKey("acct"), outbox.WithDelay(wait))
		cancelled := outbox.New(Note{Text: "cancelled"}, outbox.WithDelay(wait))
		rolledBack := outbox.New(Note{Text: "rolled back"}, outbox.WithDelay(10*time.Millisecond))
		tomorrow := outbox.New(Note{Text: "tomorrow"}, outbox.WithDeliverAt(time.Now().Add(24*time.Hour)))
		mustPublish(t, f, true, first, scheduled, cancelled, tomorrow)
		mustPublish(t, f, false, rolledBack)
		// Published after the scheduled event, due before it: goes first.
		second := outbox.New(Note{Text: "second"}, outbox.WithKey("acct"))
		mustPublish(t, f, true, second)
		expectPending(t, f, 2) // scheduled events wait aside, not in the outbox

		cancel := func(commit bool, id uuid.UUID) bool {
			t.Helper()
			ok, err := f.Cancel(ctx, commit, id)
			if err != nil {
				t.Fatalf("Cancel(%s): %v", id, err)
			}
			return ok
		}
		if !cancel(true, cancelled.ID) {
			t.Fatal("Cancel of an event still scheduled reported false")
		}
		if cancel(true, cancelled.ID) {
			t.Fatal("a second Cancel of the same event reported true")
		}
		if !cancel(false, tomorrow.ID) { // rolled back: stays scheduled
			t.Fatal("Cancel (rolled back) of an event still scheduled reported false")
		}
		if cancel(true, uuid.New()) {
			t.Fatal("Cancel of an ID never published reported true")
		}
		if sr, ok := f.Store.(outboxdriver.StatsReader); ok {
			st, err := sr.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Scheduled != 2 || st.NextDue.IsZero() || st.NextDue.After(scheduled.DeliverAt.Add(time.Millisecond)) {
				t.Fatalf("Stats: %d scheduled, next due %v; want 2, at %v", st.Scheduled, st.NextDue, scheduled.DeliverAt)
			}
		}

		q := outboxmemory.New(nil)
		sender := &sendTimes{next: q, at: map[uuid.UUID]time.Time{}}
		r := newRelay(t, f.Store, sender, fastRelay("scheduled", 10))
		WaitFor(t, 30*time.Second, "the scheduled event to be delivered", func() bool {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			return len(q.Sent()) >= 3
		})
		if at := sender.sentAt(scheduled.ID); at.Before(scheduled.DeliverAt) {
			t.Fatalf("the scheduled event was sent at %v, before its time %v", at, scheduled.DeliverAt)
		}
		// Nothing more comes: the cancelled, rolled-back and tomorrow's events stay unsent.
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range q.Sent() {
			e, err := outbox.Decode[Note](m)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, e.Payload.Text)
		}
		if len(got) != 3 || got[0] != "first" || got[1] != "second" || got[2] != "scheduled" {
			t.Fatalf("delivered %q, want [first second scheduled] (a scheduled keyed event takes its key's place when due)", got)
		}
		if cancel(true, scheduled.ID) {
			t.Fatal("Cancel of a delivered event reported true")
		}
		if !cancel(true, tomorrow.ID) {
			t.Fatal("Cancel of tomorrow's event (its earlier Cancel rolled back) reported false")
		}
		expectPending(t, f, 0)
	})
}

// sendTimes is a Sender that records when each message was sent, then sends it on.
type sendTimes struct {
	next outbox.Sender
	mu   sync.Mutex
	at   map[uuid.UUID]time.Time
}

func (s *sendTimes) Send(ctx context.Context, msgs []outbox.Message) error {
	now := time.Now()
	s.mu.Lock()
	for _, m := range msgs {
		if _, ok := s.at[m.ID]; !ok {
			s.at[m.ID] = now
		}
	}
	s.mu.Unlock()
	return s.next.Send(ctx, msgs)
}

func (s *sendTimes) sentAt(id uuid.UUID) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at[id]
}
