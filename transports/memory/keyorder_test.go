package outboxmemory_test

import (
	"context"
	"errors"
	"testing"

	"github.com/txoutbox/outbox"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// TestSendKeepsKeyOrder: the queue declares that it keeps key order within a call, and
// keeps it: after a failed message, the later messages of its key in the call fail unsent,
// while other keys and keyless messages are accepted.
func TestSendKeepsKeyOrder(t *testing.T) {
	var msgs []outbox.Message
	for _, key := range []string{"a", "a", "b", "", "a"} {
		m, err := outbox.New(cartAbandoned{}, outbox.WithKey(key)).Encode()
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	rejected := msgs[0].ID
	q := outboxmemory.New(&outboxmemory.Config{SendHook: func(m outbox.Message) error {
		if m.ID == rejected {
			return errors.New("rejected")
		}
		return nil
	}})
	if !outbox.KeepsKeyOrder(q) {
		t.Fatal("the memory queue does not declare that it keeps key order")
	}
	err := q.Send(context.Background(), msgs)
	var be *outbox.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("Send = %v, want a BatchError", err)
	}
	for _, i := range []int{0, 1, 4} {
		if be.Failed[i] == nil {
			t.Errorf("message %d of key a did not fail", i)
		}
	}
	if len(be.Failed) != 3 {
		t.Errorf("failed = %v, want only key a's three", be.Failed)
	}
	if sent := q.Sent(); len(sent) != 2 || sent[0].ID != msgs[2].ID || sent[1].ID != msgs[3].ID {
		t.Errorf("accepted %d messages, want b's and the keyless one", len(sent))
	}
}
