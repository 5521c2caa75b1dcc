package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/benchtest"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// TestTwoRelaysHundredKeysInOrder: 100 keys × 20 events, written by concurrent producers
// that serialise per key (as writers updating one aggregate row do), relayed by two relays
// through a flaky broker. Every key's events arrive in the order they were written.
func TestTwoRelaysHundredKeysInOrder(t *testing.T) {
	o := newTestOutbox(t)
	ctx := context.Background()
	const keys, perKey = 100, 20
	var published []outbox.Encodable
	for i := range perKey {
		for k := range keys {
			published = append(published, outbox.New(outboxtestNote{N: i}, outbox.WithKey(fmt.Sprintf("aggregate-%03d", k))))
		}
	}
	// Each round publishes one event per key in its own transaction, 10 keys per
	// transaction, while the relays run.
	var calls atomic.Int64
	q := outboxmemory.New(&outboxmemory.Config{SendHook: func(outbox.Message) error {
		if calls.Add(1)%7 == 0 {
			return errors.New("broker hiccup")
		}
		return nil
	}})
	cfg := &relay.Config{Name: "order", BatchSize: 64, Lease: 5 * time.Second,
		RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond, MaxPollInterval: 10 * time.Millisecond, MaxAttempts: 100}
	go func() {
		for start := 0; start < len(published); start += 10 {
			err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, published[start:start+10]...) })
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	outboxtest.RunRelays(t, o.store(t), q, 2, cfg, func() bool { return len(q.Sent()) >= len(published) })
	outboxtest.CheckPerKeyOrder(t, published, q.Sent())
	if n, _ := o.fixture(t).Pending(ctx); n != 0 {
		t.Fatalf("%d events left", n)
	}
}

// TestKeylessBehindAKeyedBacklogDrains: a backlog of keyed events with keyless ones behind
// it. The claims come back full, so a connection's claims skip the probe for keyed rows and
// take the keyless ones by the keyed path until they probe again; nothing is lost, sent
// twice or reordered, and the relay claims no more than the events need.
func TestKeylessBehindAKeyedBacklogDrains(t *testing.T) {
	o := newTestOutbox(t)
	ctx := context.Background()
	var published []outbox.Encodable
	for i := range 1000 {
		published = append(published, outbox.New(outboxtestNote{N: i}, outbox.WithKey(fmt.Sprintf("k-%d", i%10))))
	}
	for i := range 3000 {
		published = append(published, outbox.New(outboxtestNote{N: i}))
	}
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, published...) }); err != nil {
		t.Fatal(err)
	}
	q := outboxmemory.New(nil)
	store := &benchtest.CountingStore{Store: o.store(t)}
	cfg := &relay.Config{Name: "mixed", BatchSize: 50, MaxPollInterval: 10 * time.Millisecond}
	outboxtest.RunRelays(t, store, q, 1, cfg, func() bool { return len(q.Sent()) >= len(published) })
	outboxtest.CheckPerKeyOrder(t, published, q.Sent())
	if got := len(q.Sent()); got != len(published) {
		t.Fatalf("%d sent, want %d", got, len(published))
	}
	if n, _ := o.fixture(t).Pending(ctx); n != 0 {
		t.Fatalf("%d events left", n)
	}
	t.Logf("claims %d empty %d partial %d", store.Claims.Load(), store.Empty.Load(), store.Partial.Load())
	if c := store.Claims.Load() - store.Empty.Load(); c > int64(len(published)/50+10) {
		t.Fatalf("%d claims that took events, want about %d (full claims)", c, len(published)/50)
	}
}

// TestLateCommitIsNeverSkipped: two transactions write the same key without serialising
// (nothing locks a shared row). The one that inserted first commits last. The relay sends
// what is committed, so the later-inserted event goes first — order follows commits when
// writers do not serialise — but the late one is delivered too, never skipped (the trap of
// offset-based relays, Watermill #311).
func TestLateCommitIsNeverSkipped(t *testing.T) {
	o := newTestOutbox(t)
	ctx := context.Background()
	early, err := o.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback(ctx)
	first := outbox.New(outboxtestNote{N: 1}, outbox.WithKey("k"))
	if err := o.Publish(ctx, early, first); err != nil {
		t.Fatal(err)
	}
	second := outbox.New(outboxtestNote{N: 2}, outbox.WithKey("k"))
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, second) }); err != nil {
		t.Fatal(err)
	}
	q := outboxmemory.New(nil)
	relay, err := relay.New(o.store(t), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first pass relayed %d, %v; want the committed event only", n, err)
	}
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("second pass relayed %d, %v; want the late-committed event", n, err)
	}
	sent := q.Sent()
	if len(sent) != 2 || sent[0].ID != second.ID || sent[1].ID != first.ID {
		t.Fatalf("deliveries %v, want the second event then the late-committed first", sent)
	}
}

// TestStaleWriteBackNeverLetsALaterEventOvertake: relay A's lease on X (key k) expired while
// it was sending; its send failed, and its Retry write-back of X is in flight (row locked,
// not committed) just as relay B claims. B must not claim Y, the next event of k: once A's
// Retry commits, X waits for its backoff, and Y would be sent before X. Write-backs that
// reschedule or release rows take the claims' advisory locks in shared mode, so B's claim
// waits for A's write-back and then sees X waiting.
func TestStaleWriteBackNeverLetsALaterEventOvertake(t *testing.T) {
	o := newTestOutbox(t)
	ctx := context.Background()
	x, y := outbox.New(outboxtestNote{N: 1}, outbox.WithKey("k")), outbox.New(outboxtestNote{N: 2}, outbox.WithKey("k"))
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, x, y) }); err != nil {
		t.Fatal(err)
	}
	store := o.store(t)
	claimedA, err := store.Claim(ctx, outboxdriver.ClaimParams{Owner: "a", Token: 1, Limit: 1, Lease: time.Millisecond})
	if err != nil || len(claimedA) != 1 || claimedA[0].Message.ID != x.ID {
		t.Fatalf("relay A claimed %v, %v; want X alone", claimedA, err)
	}
	outboxtest.WaitFor(t, 10*time.Second, "A's lease to expire", func() bool {
		var expired bool
		err := o.pool.QueryRow(ctx, "SELECT lease_until < now() FROM "+o.schema+".outbox WHERE seq = $1", claimedA[0].Seq).Scan(&expired)
		return err == nil && expired
	})

	// A's Retry, executed but not yet committed.
	writeBack, err := o.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writeBack.Rollback(ctx)
	if err := o.storeOn(t, writeBack).Retry(ctx, 1, []outboxdriver.Retry{{Seq: claimedA[0].Seq, Delay: time.Hour, Error: "send failed"}}); err != nil {
		t.Fatal(err)
	}

	type result struct {
		claimed []outboxdriver.Claimed
		err     error
	}
	claimB := make(chan result, 1)
	go func() {
		c, err := store.Claim(ctx, outboxdriver.ClaimParams{Owner: "b", Token: 2, Limit: 10, Lease: time.Minute})
		claimB <- result{c, err}
	}()
	// B's claim either returns at once (it skipped the locked X) or waits on the lock.
	var early *result
	outboxtest.WaitFor(t, 10*time.Second, "B's claim to return or to wait for the write-back", func() bool {
		select {
		case r := <-claimB:
			early = &r
			return true
		default:
		}
		var waiting int
		err := o.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, o.schema).Scan(&waiting)
		return err == nil && waiting > 0
	})
	if err := writeBack.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := early
	if r == nil {
		got := <-claimB
		r = &got
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, c := range r.claimed {
		if c.Message.ID == y.ID {
			t.Fatal("relay B claimed Y while X, the earlier event of its key, was being rescheduled: Y would overtake X")
		}
	}
	if len(r.claimed) != 0 {
		t.Fatalf("relay B claimed %d messages, want none (X waits for its retry, Y behind it)", len(r.claimed))
	}
}

// TestLongRunIsReleasedBeforeItsLeaseEnds: a claim takes a whole run of one key, and the
// broker is slow. The relay starts a wave only while a whole SendTimeout still fits in the
// lease, and gives back the rest untouched, so no message of the run is sent after another
// relay could have claimed it.
func TestLongRunIsReleasedBeforeItsLeaseEnds(t *testing.T) {
	t.Parallel()
	o := newTestOutbox(t)
	ctx := context.Background()
	const n = 20
	var events []outbox.Encodable
	for i := range n {
		events = append(events, outbox.New(outboxtestNote{N: i}, outbox.WithKey("slow")))
	}
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, events...) }); err != nil {
		t.Fatal(err)
	}
	// 200 ms a message: the run of 20 needs 4 s, the lease is 2 s and waves may start
	// until 1.5 s after the claim.
	q := outboxmemory.New(&outboxmemory.Config{SendHook: func(outbox.Message) error {
		time.Sleep(200 * time.Millisecond)
		return nil
	}})
	// Sent as to a transport that cannot keep key order within a call (only Send shows), so
	// the run goes in waves of one message: a key-ordering transport gets the run in one
	// call, bounded by SendTimeout like any batch.
	waves := struct{ outbox.Sender }{q}
	relay, err := relay.New(o.store(t), waves, &relay.Config{Lease: 2 * time.Second, SendTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := relay.RunOnce(ctx)
	if err != nil || claimed != n {
		t.Fatalf("the claim took %d messages, %v; want the whole run of %d", claimed, err, n)
	}
	sent := len(q.Sent())
	if sent == 0 || sent >= n {
		t.Fatalf("%d of the run's %d messages were sent within one 2 s lease at 200 ms each; want some, and the rest given back", sent, n)
	}
	// What was given back is claimable at once, with no attempt counted.
	var leased, tried int
	if err := o.pool.QueryRow(ctx, "SELECT count(lease_until), count(*) FILTER (WHERE attempts > 0) FROM "+o.schema+".outbox").Scan(&leased, &tried); err != nil {
		t.Fatal(err)
	}
	if leased != 0 || tried != 0 {
		t.Fatalf("after the claim, %d rows are still leased and %d count an attempt; want the rest released untouched", leased, tried)
	}
	outboxtest.WaitFor(t, 30*time.Second, "the rest of the run", func() bool {
		if _, err := relay.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return len(q.Sent()) >= n
	})
	outboxtest.CheckPerKeyOrder(t, events, q.Sent())
}

// TestRunEndsAtAWaitingEvent: a key's events X, Y, Z where Y waits for a retry and X, whose
// transaction committed late, is free: a claim takes X (its key's first event) and not Z,
// which must wait behind Y.
func TestRunEndsAtAWaitingEvent(t *testing.T) {
	t.Parallel()
	o := newTestOutbox(t)
	ctx := context.Background()
	x := outbox.New(outboxtestNote{N: 1}, outbox.WithKey("k"))
	y := outbox.New(outboxtestNote{N: 2}, outbox.WithKey("k"))
	z := outbox.New(outboxtestNote{N: 3}, outbox.WithKey("k"))
	late, err := o.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx)
	if err := o.Publish(ctx, late, x); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, y) }); err != nil {
		t.Fatal(err)
	}
	store := o.store(t)
	claimed, err := store.Claim(ctx, outboxdriver.ClaimParams{Owner: "a", Token: 1, Limit: 10, Lease: time.Minute})
	if err != nil || len(claimed) != 1 || claimed[0].Message.ID != y.ID {
		t.Fatalf("first claim %v, %v; want Y alone", claimed, err)
	}
	if err := store.Retry(ctx, 1, []outboxdriver.Retry{{Seq: claimed[0].Seq, Delay: time.Hour, Error: "broker down"}}); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, z) }); err != nil {
		t.Fatal(err)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	claimed, err = store.Claim(ctx, outboxdriver.ClaimParams{Owner: "b", Token: 2, Limit: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].Message.ID != x.ID {
		var got []int
		for _, c := range claimed {
			got = append(got, map[uuid.UUID]int{x.ID: 1, y.ID: 2, z.ID: 3}[c.Message.ID])
		}
		t.Fatalf("second claim took events %v, want [1] (X; Z waits behind Y)", got)
	}
}
