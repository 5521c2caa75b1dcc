package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// exerciseHeldKeys runs the store side of "a dead-lettered keyed event holds its key": under
// KeyPolicy HoldKey (the default) the key's later events wait, whatever path a claim takes
// and however many relays claim, until the dead letter is replayed (it goes first) or
// discarded (the key moves on); under SkipKey they go on. Plus the retry budget by time,
// which counts from Claimed.FirstFailedAt.
func exerciseHeldKeys(t *testing.T, newFixture func(t *testing.T) *StoreFixture) {
	ctx := context.Background()

	setup := func(t *testing.T, policy relay.KeyPolicy) *heldKey {
		t.Helper()
		h := &heldKey{f: newFixture(t), fixed: &atomic.Bool{}}
		for i := range 3 {
			h.k = append(h.k, outbox.New(Note{Text: "k", N: i + 1}, outbox.WithKey("k")))
		}
		h.flowing = []outbox.Event[Note]{outbox.New(Note{Text: "other"}, outbox.WithKey("other")), outbox.New(Note{Text: "keyless"})}
		mustPublish(t, h.f, true, h.k[0], h.k[1], h.k[2], h.flowing[0], h.flowing[1])
		first := h.k[0].ID
		h.q = outboxmemory.New(&outboxmemory.Config{SendHook: func(m outbox.Message) error {
			if m.ID == first && !h.fixed.Load() {
				return outbox.Permanent(errors.New("rejected until fixed"))
			}
			return nil
		}})
		cfg := fastRelay("held", 10)
		cfg.KeyPolicy = policy
		h.r = newRelay(t, h.f.Store, h.q, cfg)
		WaitFor(t, 30*time.Second, "the other events to be delivered and the first of k dead-lettered", func() bool {
			h.runOnce(t)
			dl, err := h.f.DeadLetterTable.List(ctx, deadletter.Filter{EventID: first})
			if err != nil {
				t.Fatal(err)
			}
			sent := ids(h.q.Sent())
			if len(dl) == 1 && sent[h.flowing[0].ID] && sent[h.flowing[1].ID] {
				h.entry = dl[0]
				return true
			}
			return false
		})
		return h
	}
	// idle runs the relay a few more times: what is claimable is claimed by then.
	idle := func(t *testing.T, h *heldKey) {
		t.Helper()
		for range 5 {
			h.runOnce(t)
		}
	}
	heldKeys := func(t *testing.T, f *StoreFixture) int64 {
		t.Helper()
		sr, ok := f.Store.(outboxdriver.StatsReader)
		if !ok {
			return -1
		}
		st, err := sr.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.HeldKeys
	}

	t.Run("HeldKeyWaitsForItsDeadLetter", func(t *testing.T) {
		t.Parallel()
		h := setup(t, relay.HoldKey)
		later := outbox.New(Note{Text: "k", N: 4}, outbox.WithKey("k")) // published after the hold
		mustPublish(t, h.f, true, later)
		idle(t, h)
		sent := ids(h.q.Sent())
		for _, e := range append(h.k[1:], later) {
			if sent[e.ID] {
				t.Fatalf("event %d of key k was delivered while the key's dead letter is pending", e.Payload.N)
			}
		}
		if h.entry.HeldSeq == 0 || h.entry.Status != deadletter.StatusPending || h.entry.Kind != deadletter.KindPermanent {
			t.Errorf("the dead letter holds row %d, status %s, kind %s; want a row, pending, permanent", h.entry.HeldSeq, h.entry.Status, h.entry.Kind)
		}
		expectPending(t, h.f, 4) // the held row and the three behind it
		if n := heldKeys(t, h.f); n != 1 && n != -1 {
			t.Errorf("Stats.HeldKeys = %d, want 1", n)
		}
	})

	t.Run("ReplayOfAHeldKeyGoesFirst", func(t *testing.T) {
		t.Parallel()
		h := setup(t, relay.HoldKey)
		h.fixed.Store(true)
		if err := h.f.DeadLetterTable.Replay(ctx, h.entry.ID); err != nil {
			t.Fatal(err)
		}
		h.drain(t)
		if got := h.keyOrder("k"); !sameIDs(got, h.k) {
			t.Fatalf("key k delivered as %v, want %v: the replayed event first, then the others", got, eventIDs(h.k))
		}
		first := h.delivered(h.k[0].ID)
		if first.Headers[outbox.ReplayHeader] != strconv.FormatInt(h.entry.ID, 10) {
			t.Errorf("the replayed event has %s %q, want the dead letter's ID %d", outbox.ReplayHeader, first.Headers[outbox.ReplayHeader], h.entry.ID)
		}
		if err := SameMessage(stripReplay(first), mustEncode(t, h.k[0])); err != nil {
			t.Errorf("the replayed event changed: %v", err)
		}
		e, err := h.f.DeadLetterTable.Get(ctx, h.entry.ID)
		if err != nil || e.Status != deadletter.StatusReplayed {
			t.Fatalf("after replay the dead letter is %s (%v), want replayed", e.Status, err)
		}
		if n := heldKeys(t, h.f); n != 0 && n != -1 {
			t.Errorf("Stats.HeldKeys = %d after the replay, want 0", n)
		}
		if err := h.f.DeadLetterTable.Replay(ctx, h.entry.ID); !errors.Is(err, deadletter.ErrNotPending) {
			t.Errorf("a second replay: %v, want deadletter.ErrNotPending", err)
		}
	})

	t.Run("ReplayedHeldEventStartsItsRetriesAfresh", func(t *testing.T) {
		t.Parallel()
		h := setup(t, relay.HoldKey)
		if err := h.f.DeadLetterTable.Replay(ctx, h.entry.ID); err != nil { // not fixed: fails again
			t.Fatal(err)
		}
		var again []deadletter.Entry
		WaitFor(t, 30*time.Second, "the replayed event to fail again", func() bool {
			h.runOnce(t)
			var err error
			again, err = h.f.DeadLetterTable.List(ctx, deadletter.Filter{EventID: h.k[0].ID, Status: deadletter.StatusPending})
			if err != nil {
				t.Fatal(err)
			}
			return len(again) == 1
		})
		if e := again[0]; e.HeldSeq != h.entry.HeldSeq || e.Attempts != 1 || e.ID == h.entry.ID {
			t.Errorf("the second dead letter holds row %d after %d attempts (entry %d); want row %d again, 1 attempt, a new entry",
				e.HeldSeq, e.Attempts, e.ID, h.entry.HeldSeq)
		}
		idle(t, h)
		if sent := ids(h.q.Sent()); sent[h.k[1].ID] || sent[h.k[2].ID] {
			t.Fatal("the key went on after its replayed event failed again")
		}
	})

	t.Run("DiscardOfAHeldKeyMovesItOn", func(t *testing.T) {
		t.Parallel()
		h := setup(t, relay.HoldKey)
		if err := h.f.DeadLetterTable.Discard(ctx, h.entry.ID); err != nil {
			t.Fatal(err)
		}
		h.drain(t)
		if got := h.keyOrder("k"); !sameIDs(got, h.k[1:]) {
			t.Fatalf("key k delivered as %v, want %v: the later events, without the discarded one", got, eventIDs(h.k[1:]))
		}
		e, err := h.f.DeadLetterTable.Get(ctx, h.entry.ID)
		if err != nil || e.Status != deadletter.StatusDiscarded {
			t.Fatalf("after discard the dead letter is %s (%v), want discarded", e.Status, err)
		}
		if n := heldKeys(t, h.f); n != 0 && n != -1 {
			t.Errorf("Stats.HeldKeys = %d after the discard, want 0", n)
		}
	})

	t.Run("SkipKeyLetsLaterEventsPass", func(t *testing.T) {
		t.Parallel()
		h := setup(t, relay.SkipKey)
		h.drain(t)
		if got := h.keyOrder("k"); !sameIDs(got, h.k[1:]) {
			t.Fatalf("key k delivered as %v, want %v", got, eventIDs(h.k[1:]))
		}
		if h.entry.HeldSeq != 0 {
			t.Errorf("under SkipKey the dead letter holds row %d", h.entry.HeldSeq)
		}
		if n := heldKeys(t, h.f); n != 0 && n != -1 {
			t.Errorf("Stats.HeldKeys = %d under SkipKey, want 0", n)
		}
		// Replayed later, the event goes in anew: after the events that passed it.
		h.fixed.Store(true)
		if err := h.f.DeadLetterTable.Replay(ctx, h.entry.ID); err != nil {
			t.Fatal(err)
		}
		h.drain(t)
		want := []outbox.Event[Note]{h.k[1], h.k[2], h.k[0]}
		if got := h.keyOrder("k"); !sameIDs(got, want) {
			t.Fatalf("key k delivered as %v, want %v", got, eventIDs(want))
		}
	})

	// Several keys held at once deep in a backlog of few keys, with three relays claiming
	// in small batches: claims reach past their window (the keys' heads, keyless rows far
	// back) and must still never take a held row or one behind it. Replaying every dead
	// letter then delivers each key in the order it was written.
	t.Run("HeldKeysHoldUnderConcurrentClaims", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		const keys, perKey, poisonAt = 8, 30, 6
		var (
			events []outbox.Encodable
			poison = map[uuid.UUID]bool{}
			before = map[uuid.UUID]bool{} // deliverable while the keys are held
		)
		for i := range perKey {
			for k := range keys {
				e := outbox.New(Note{N: i}, outbox.WithKey(fmt.Sprintf("held-%d", k)))
				events = append(events, e)
				switch {
				case k%2 == 0 && i == poisonAt:
					poison[e.ID] = true
				case k%2 == 1 || i < poisonAt:
					before[e.ID] = true
				}
			}
			if i%3 == 0 {
				e := outbox.New(Note{N: i})
				events = append(events, e)
				before[e.ID] = true
			}
		}
		mustPublish(t, f, true, events...)
		var fixed atomic.Bool
		q := outboxmemory.New(&outboxmemory.Config{SendHook: func(m outbox.Message) error {
			if poison[m.ID] && !fixed.Load() {
				return outbox.Permanent(errors.New("rejected until fixed"))
			}
			return nil
		}})
		relays := f.relays()
		cfg := fastRelay("held", 10)
		cfg.BatchSize = 6
		RunRelays(t, f.Store, q, relays, cfg, func() bool {
			return len(deadLetters(t, f)) == len(poison) && len(ids(q.Sent())) >= len(before)
		})
		for id := range ids(q.Sent()) {
			if !before[id] {
				t.Fatalf("event %s was delivered while an earlier event of its key was held", id)
			}
		}
		if n := heldKeys(t, f); n != int64(len(poison)) && n != -1 {
			t.Errorf("Stats.HeldKeys = %d, want %d", n, len(poison))
		}
		fixed.Store(true)
		pending, err := deadletter.Matching(ctx, f.DeadLetterTable, deadletter.Filter{Status: deadletter.StatusPending})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := deadletter.ReplayEach(ctx, f.DeadLetterTable, pending, nil); err != nil || res.Done != len(poison) {
			t.Fatalf("replaying the held keys: %+v, %v", res, err)
		}
		RunRelays(t, f.Store, q, relays, cfg, func() bool { return len(ids(q.Sent())) >= len(events) })
		CheckPerKeyOrder(t, events, q.Sent())
		expectPending(t, f, 0)
	})

	// A relay whose lease expired cannot hold a row that another relay claimed since (its
	// write-back carries a stale token); one whose lease expired unclaimed still can, and the
	// key's next row then waits.
	t.Run("StaleHoldChangesNothing", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		x := outbox.New(Note{N: 1}, outbox.WithKey("k"))
		y := outbox.New(Note{N: 2}, outbox.WithKey("k"))
		mustPublish(t, f, true, x, y)
		claim := func(token int64, limit int, lease time.Duration) []outboxdriver.Claimed {
			t.Helper()
			c, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: token, Limit: limit, Lease: lease})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		first := claim(11, 1, 300*time.Millisecond)
		if len(first) != 1 || first[0].Message.ID != x.ID {
			t.Fatalf("first claim: %+v", first)
		}
		var second []outboxdriver.Claimed
		WaitFor(t, 10*time.Second, "the expired lease to be reclaimed", func() bool {
			second = claim(22, 10, time.Minute)
			return len(second) > 0
		})
		if second[0].Message.ID != x.ID {
			t.Fatalf("the reclaim took %v first, want the key's first event", second[0].Message.ID)
		}
		hold := []outboxdriver.DeadLetter{{Seq: first[0].Seq, Kind: string(deadletter.KindPermanent), Reason: "stale", HoldKey: true}}
		if moved, err := f.Store.DeadLetter(ctx, 11, hold); err != nil || len(moved) != 0 {
			t.Fatalf("a stale DeadLetter with HoldKey moved %v (%v), want nothing", moved, err)
		}
		if dl := deadLetters(t, f); len(dl) != 0 {
			t.Fatalf("a stale owner dead-lettered a message: %+v", dl)
		}
		// The current owner gives them back; its own lease then runs out unclaimed, and
		// its late hold still applies (its token is the row's last).
		seqs := make([]int64, len(second))
		for i, c := range second {
			seqs[i] = c.Seq
		}
		if err := f.Store.Release(ctx, 22, seqs); err != nil {
			t.Fatal(err)
		}
		third := claim(33, 1, time.Millisecond) // a lease that is over by the write-back
		if len(third) != 1 || third[0].Message.ID != x.ID {
			t.Fatalf("third claim: %+v", third)
		}
		hold[0].Seq = third[0].Seq
		if moved, err := f.Store.DeadLetter(ctx, 33, hold); err != nil || len(moved) != 1 {
			t.Fatalf("a DeadLetter with HoldKey after its lease expired, unclaimed: moved %v (%v), want the row", moved, err)
		}
		if c := claim(44, 10, time.Minute); len(c) != 0 {
			t.Fatalf("a claim took %d rows of a held key", len(c))
		}
		expectPending(t, f, 2)
	})

	// A row the relay cannot read, whose key it can, holds that key too: replaying it is
	// refused (it would only fail again), discarding it lets the key go on.
	t.Run("UnreadableRowHoldsItsKey", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		needSQL(t, f.SQL)
		spoil := map[string]string{
			"postgres": `headers = '{"n": 1}'`,
			"mysql":    "id = 'not-a-uuid'",
			"sqlite":   "id = 'not-a-uuid'",
		}[f.SQL.Dialect]
		if spoil == "" {
			t.Skipf("no spoiling SQL for dialect %q", f.SQL.Dialect)
		}
		a1 := outbox.New(Note{Text: "a1"}, outbox.WithKey("a"))
		a2 := outbox.New(Note{Text: "a2"}, outbox.WithKey("a"))
		mustPublish(t, f, true, a1, a2)
		f.SQL.exec(t, "UPDATE "+f.SQL.Outbox+" SET "+spoil+" WHERE id = '"+a2.ID.String()+"'")
		q := outboxmemory.New(nil)
		r := newRelay(t, f.Store, q, fastRelay("unreadable", 10))
		var dl []deadletter.Entry
		WaitFor(t, 30*time.Second, "the unreadable row to be dead-lettered", func() bool {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			var err error
			dl, err = f.DeadLetterTable.List(ctx, deadletter.Filter{Kind: deadletter.KindUnreadableRow})
			if err != nil {
				t.Fatal(err)
			}
			return len(dl) == 1
		})
		// Published after the hold, so in a claim of its own: it waits.
		a3 := outbox.New(Note{Text: "a3"}, outbox.WithKey("a"))
		mustPublish(t, f, true, a3)
		for range 5 {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if ids(q.Sent())[a3.ID] {
			t.Fatal("an event was delivered behind an unreadable row of its key that holds it")
		}
		if dl[0].HeldSeq == 0 {
			t.Fatal("the unreadable row's dead letter holds nothing")
		}
		if err := f.DeadLetterTable.Replay(ctx, dl[0].ID); !errors.Is(err, deadletter.ErrNotReplayable) {
			t.Fatalf("replaying a held unreadable row: %v, want deadletter.ErrNotReplayable", err)
		}
		if err := f.DeadLetterTable.Discard(ctx, dl[0].ID); err != nil {
			t.Fatal(err)
		}
		drainOutbox(t, f, r, "after the discard")
		want := []outbox.Event[Note]{a1, a3}
		if got := keyOrder(q.Sent(), "a"); !sameIDs(got, want) {
			t.Fatalf("key a delivered as %v, want %v", got, eventIDs(want))
		}
	})

	t.Run("FirstFailedAtIsReturnedByTheClaim", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		mustPublish(t, f, true, outbox.New(Note{Text: "fails"}))
		c := mustClaim(t, f, 1)
		if !c.FirstFailedAt.IsZero() {
			t.Fatalf("a message never sent has FirstFailedAt %v", c.FirstFailedAt)
		}
		before := time.Now()
		if err := f.Store.Retry(ctx, 1, []outboxdriver.Retry{{Seq: c.Seq, Error: "first failure"}}); err != nil {
			t.Fatal(err)
		}
		c = mustClaim(t, f, 2)
		first := c.FirstFailedAt
		// The database's clock, on this machine: within a minute of ours.
		if first.IsZero() || first.Before(before.Add(-time.Minute)) || first.After(time.Now().Add(time.Minute)) {
			t.Fatalf("after a failure FirstFailedAt is %v, want about %v", first, before)
		}
		if err := f.Store.Retry(ctx, 2, []outboxdriver.Retry{{Seq: c.Seq, Error: "second failure"}}); err != nil {
			t.Fatal(err)
		}
		if c = mustClaim(t, f, 3); !c.FirstFailedAt.Equal(first) {
			t.Fatalf("after a second failure FirstFailedAt is %v, want the first's %v", c.FirstFailedAt, first)
		}
	})

	t.Run("MaxRetryTimeDeadLettersByTime", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		e := outbox.New(Note{Text: "keeps failing"})
		mustPublish(t, f, true, e)
		q := outboxmemory.New(&outboxmemory.Config{SendHook: func(outbox.Message) error { return errors.New("refused, for now") }})
		cfg := fastRelay("budget", 1_000_000) // attempts would never run out
		cfg.MaxRetryTime = 300 * time.Millisecond
		r := newRelay(t, f.Store, q, cfg)
		WaitFor(t, 30*time.Second, "the message to be dead-lettered by MaxRetryTime", func() bool {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			return len(deadLetters(t, f)) == 1
		})
		dl := deadLetters(t, f)[0]
		if dl.EventID != e.ID || dl.Attempts < 2 || !strings.Contains(dl.Reason, "MaxRetryTime") {
			t.Fatalf("dead letter %+v, want the event after 2 attempts or more, naming MaxRetryTime", dl)
		}
	})
}

// heldKey is a store fixture with three events of key "k" published, the first of which
// fails until fixed, one of another key and one keyless; its relay has run until the others
// were delivered and the first was dead-lettered.
type heldKey struct {
	f       *StoreFixture
	q       *outboxmemory.Queue
	r       *relay.Relay
	fixed   *atomic.Bool
	k       []outbox.Event[Note] // k[0] fails until fixed
	entry   deadletter.Entry     // k[0]'s dead letter
	flowing []outbox.Event[Note] // the other key's event and the keyless one
}

// runOnce runs the relay once.
func (h *heldKey) runOnce(t *testing.T) {
	t.Helper()
	if _, err := h.r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// drain runs the relay until the outbox is empty.
func (h *heldKey) drain(t *testing.T) {
	t.Helper()
	drainOutbox(t, h.f, h.r, "draining")
}

// keyOrder returns the IDs of key's events in the order of their first delivery.
func (h *heldKey) keyOrder(key string) []uuid.UUID { return keyOrder(h.q.Sent(), key) }

// delivered returns the first delivery of event id.
func (h *heldKey) delivered(id uuid.UUID) outbox.Message {
	for _, m := range h.q.Sent() {
		if m.ID == id {
			return m
		}
	}
	return outbox.Message{}
}

// keyOrder returns the IDs of key's messages in sent, each at its first delivery.
func keyOrder(sent []outbox.Message, key string) []uuid.UUID {
	var out []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, m := range sent {
		if m.Key == key && !seen[m.ID] {
			seen[m.ID] = true
			out = append(out, m.ID)
		}
	}
	return out
}

// eventIDs returns the IDs of events, in order.
func eventIDs[T outbox.Payload](events []outbox.Event[T]) []uuid.UUID {
	out := make([]uuid.UUID, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// sameIDs reports whether got are the IDs of want, in order.
func sameIDs[T outbox.Payload](got []uuid.UUID, want []outbox.Event[T]) bool {
	w := eventIDs(want)
	if len(got) != len(w) {
		return false
	}
	for i := range got {
		if got[i] != w[i] {
			return false
		}
	}
	return true
}

// stripReplay returns m without its replay mark.
func stripReplay(m outbox.Message) outbox.Message {
	h := make(map[string]string, len(m.Headers))
	for k, v := range m.Headers {
		if k != outbox.ReplayHeader {
			h[k] = v
		}
	}
	if len(h) == 0 {
		h = nil
	}
	m.Headers = h
	return m
}

func mustEncode(t testing.TB, e outbox.Encodable) outbox.Message {
	t.Helper()
	m, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// mustClaim claims the outbox's one message with token, waiting for it to be due.
func mustClaim(t *testing.T, f *StoreFixture, token int64) outboxdriver.Claimed {
	t.Helper()
	var got []outboxdriver.Claimed
	WaitFor(t, 10*time.Second, "the message to be claimable", func() bool {
		var err error
		got, err = f.Store.Claim(context.Background(), outboxdriver.ClaimParams{Owner: "t", Token: token, Limit: 10, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return len(got) > 0
	})
	if len(got) != 1 {
		t.Fatalf("claimed %d messages, want 1", len(got))
	}
	return got[0]
}
