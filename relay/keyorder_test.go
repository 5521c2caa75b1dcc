package relay_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// keyedStore is a listStore of messages with the given keys, in outbox order.
func keyedStore(keys ...string) *listStore {
	s := &listStore{}
	for i, key := range keys {
		m, _ := outbox.New(testPayload{}, outbox.WithKey(key)).Encode()
		s.rows = append(s.rows, &listRow{seq: int64(i + 1), msg: m})
	}
	return s
}

// callRecorder is a Sender that keeps key order and records each call's keys.
type callRecorder struct {
	*outboxmemory.Queue
	calls [][]string
}

func (c *callRecorder) Send(ctx context.Context, msgs []outbox.Message) error {
	c.calls = append(c.calls, keysOf(msgs))
	return c.Queue.Send(ctx, msgs)
}

func (c *callRecorder) KeepsKeyOrder() bool { return outbox.KeepsKeyOrder(c.Queue) }

// TestKeyOrdererGetsTheClaimInOneCall: a Sender that keeps key order gets a claim's runs of
// one key in one call, in outbox order; one that does not gets one message of each key per call.
func TestKeyOrdererGetsTheClaimInOneCall(t *testing.T) {
	keys := []string{"a", "a", "b", "a", "", "b"}
	ordered := &callRecorder{Queue: outboxmemory.New(nil)}
	if _, err := quickRelay(t, keyedStore(keys...), ordered, nil).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := [][]string{keys}; !slices.EqualFunc(ordered.calls, want, slices.Equal) {
		t.Errorf("a key-ordering Sender's calls = %q, want %q", ordered.calls, want)
	}

	waves := &recordingSender{}
	if _, err := quickRelay(t, keyedStore(keys...), waves, nil).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"a", "b", ""}, {"a", "b"}, {"a"}}; !slices.EqualFunc(waves.calls, want, slices.Equal) {
		t.Errorf("another Sender's calls = %q, want %q", waves.calls, want)
	}
}

// recordingSender records each call's keys and keeps no promise of key order.
type recordingSender struct{ calls [][]string }

func (r *recordingSender) Send(_ context.Context, msgs []outbox.Message) error {
	r.calls = append(r.calls, keysOf(msgs))
	return nil
}

// TestKeyOrdererFailureHoldsTheRestOfItsKey: when a key-ordering Sender fails a message, the
// key's later messages of the call are given back without spending an attempt, other keys
// go on, and the retried message goes first: the broker sees each key in outbox order.
func TestKeyOrdererFailureHoldsTheRestOfItsKey(t *testing.T) {
	store := keyedStore("a", "a", "b", "a", "b")
	var want []uuid.UUID // key a's messages in outbox order
	for _, row := range store.rows {
		if row.msg.Key == "a" {
			want = append(want, row.msg.ID)
		}
	}
	var failed atomic.Bool
	q := outboxmemory.New(&outboxmemory.Config{SendHook: func(m outbox.Message) error {
		if m.ID == want[1] && failed.CompareAndSwap(false, true) {
			return errors.New("rejected once")
		}
		return nil
	}})
	r := quickRelay(t, store, q, nil)
	if n, err := r.RunOnce(context.Background()); n != 5 || err != nil {
		t.Fatalf("first RunOnce = %d, %v", n, err)
	}
	if got := keysOf(q.Sent()); !slices.Equal(got, []string{"a", "b", "b"}) {
		t.Fatalf("the first call delivered keys %q, want a's first, then both of b", got)
	}
	_, _, _, _, attempts := store.snapshot()
	if !slices.Equal(attempts, []int{1, 0}) { // the failed one spent its attempt, a's last got it back
		t.Fatalf("attempts of the rows left = %v, want [1 0]", attempts)
	}
	waitUntil(t, "the retry to go out", func() bool {
		_, _ = r.RunOnce(context.Background())
		left, _, _, _, _ := store.snapshot()
		return left == 0
	})
	var got []uuid.UUID
	for _, m := range q.Sent() {
		if m.Key == "a" {
			got = append(got, m.ID)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("key a reached the queue as %v, want outbox order %v", got, want)
	}
	if _, _, dead, _, _ := store.snapshot(); len(dead) != 0 {
		t.Errorf("dead letters = %+v, want none", dead)
	}
}

func keysOf(msgs []outbox.Message) []string {
	var keys []string
	for _, m := range msgs {
		keys = append(keys, m.Key)
	}
	return keys
}
