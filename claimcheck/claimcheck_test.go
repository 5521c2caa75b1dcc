package claimcheck_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/claimcheck"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type doc struct{ Text string }

func (doc) EventType() string { return "test.doc" }

func message(t *testing.T, key string, size int) outbox.Message {
	t.Helper()
	m, err := outbox.New(doc{Text: strings.Repeat("x", size)}, outbox.WithKey(key)).Encode()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newDir(t *testing.T) *claimcheck.Dir {
	t.Helper()
	d, err := claimcheck.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func newSender(t *testing.T, next outbox.Sender, cfg *claimcheck.SenderConfig) outbox.Sender {
	t.Helper()
	s, err := claimcheck.NewSender(next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func blobs(t *testing.T, s claimcheck.BlobStore) []string {
	t.Helper()
	var keys []string
	if err := s.List(context.Background(), func(b claimcheck.Blob) bool { keys = append(keys, b.Key); return true }); err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestDirIsABlobStore(t *testing.T) {
	outboxtest.ExerciseBlobStore(t, func(t *testing.T) claimcheck.BlobStore { return newDir(t) })
}

func TestNewSenderValidates(t *testing.T) {
	_, err := claimcheck.NewSender(nil, &claimcheck.SenderConfig{Threshold: -1})
	if err == nil || !strings.Contains(err.Error(), "Sender to wrap") || !strings.Contains(err.Error(), "Store is required") {
		t.Fatalf("NewSender(nil, no store) = %v, want both problems", err)
	}
	_, err = claimcheck.NewSender(outboxmemory.New(nil), &claimcheck.SenderConfig{Store: newDir(t), Threshold: -1})
	if err == nil || !strings.Contains(err.Error(), "Threshold -1") {
		t.Fatalf("NewSender(Threshold -1) = %v, want it named", err)
	}
}

// TestThreshold: a body over the threshold travels as a reference to its blob, keyed by the
// event ID; a smaller one as it is; the caller's messages are not changed; sending again
// rewrites the same blob.
func TestThreshold(t *testing.T) {
	store := newDir(t)
	q := outboxmemory.New(nil)
	s := newSender(t, q, &claimcheck.SenderConfig{Store: store, Threshold: 1000})
	big, small := message(t, "k", 5000), message(t, "k", 10)
	msgs := []outbox.Message{big, small}
	for range 2 {
		if err := s.Send(context.Background(), msgs); err != nil {
			t.Fatal(err)
		}
	}
	if len(msgs[0].Body) != len(big.Body) || msgs[0].Headers[claimcheck.Header] != "" {
		t.Fatal("Send changed the caller's message")
	}
	sent := q.Sent()
	if len(sent) != 4 {
		t.Fatalf("sent %d messages, want 4", len(sent))
	}
	ref := sent[0]
	if len(ref.Body) != 0 || ref.Headers[claimcheck.Header] != store.Ref(claimcheck.Key(big.ID)) || ref.ID != big.ID || ref.Type != big.Type || ref.Key != "k" {
		t.Fatalf("sent %+v, want the event with an empty body and dataref %s", ref, store.Ref(claimcheck.Key(big.ID)))
	}
	if !bytes.Equal(sent[1].Body, small.Body) || sent[1].Headers[claimcheck.Header] != "" {
		t.Fatalf("the small message was changed: %+v", sent[1])
	}
	if keys := blobs(t, store); len(keys) != 1 || keys[0] != claimcheck.Key(big.ID) {
		t.Fatalf("blobs %v after sending twice, want one, %s", keys, claimcheck.Key(big.ID))
	}
	got, err := store.Get(context.Background(), claimcheck.Key(big.ID))
	if err != nil || !bytes.Equal(got, big.Body) {
		t.Fatalf("blob = %d bytes, %v; want the body", len(got), err)
	}
}

// TestTooLargeFallback: without a threshold, a message the transport refuses as too large
// goes to the store and is sent again in the same call, with the later messages of its key
// that the transport held back, in order; other failures stay failures.
func TestTooLargeFallback(t *testing.T) {
	store := newDir(t)
	poison := message(t, "p", 10)
	q := outboxmemory.New(&outboxmemory.Config{MaxMessageBytes: 1000, SendHook: func(m outbox.Message) error {
		if m.ID == poison.ID {
			return errors.New("refused")
		}
		return nil
	}})
	s := newSender(t, q, &claimcheck.SenderConfig{Store: store})
	msgs := []outbox.Message{message(t, "k", 10), message(t, "k", 5000), message(t, "k", 20), message(t, "", 3000),
		poison, message(t, "p", 4000)}
	err := s.Send(context.Background(), msgs)
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 2 || be.Failed[4] == nil || be.Failed[5] == nil {
		t.Fatalf("Send = %v, want messages 4 and 5 (key p) failed", err)
	}
	var order []outbox.Message
	for _, m := range q.Sent() {
		if m.Key == "k" {
			order = append(order, m)
		}
	}
	if len(order) != 3 || order[0].ID != msgs[0].ID || order[1].ID != msgs[1].ID || order[2].ID != msgs[2].ID {
		t.Fatalf("key k sent as %v, want in order", order)
	}
	if order[1].Headers[claimcheck.Header] == "" || len(q.Sent()) != 4 {
		t.Fatalf("sent %d, the big one as %+v; want 4 sent, the big one by reference", len(q.Sent()), order[1].Headers)
	}
	if keys := blobs(t, store); len(keys) != 2 {
		t.Fatalf("blobs %v, want the two too-large bodies", keys)
	}
}

type failingStore struct{ claimcheck.BlobStore }

func (failingStore) Put(context.Context, string, []byte) error { return errors.New("store down") }

// TestStoreDown: a blob that cannot be written fails its message as unavailable (the relay
// pauses, spending no attempt), and the later messages of its key are not sent.
func TestStoreDown(t *testing.T) {
	q := outboxmemory.New(nil)
	s := newSender(t, q, &claimcheck.SenderConfig{Store: failingStore{newDir(t)}, Threshold: 100})
	msgs := []outbox.Message{message(t, "k", 1000), message(t, "k", 10), message(t, "j", 10)}
	err := s.Send(context.Background(), msgs)
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 2 || !outbox.IsUnavailable(be.Failed[0]) || be.Failed[1] == nil {
		t.Fatalf("Send = %v, want messages 0 (unavailable) and 1 failed", err)
	}
	if sent := q.Sent(); len(sent) != 1 || sent[0].ID != msgs[2].ID {
		t.Fatalf("sent %v, want only key j's message", sent)
	}
}

type bare struct{ outbox.Sender }

// TestForwards: the wrapper is a KeyOrderer, Pinger and Describer exactly when the wrapped
// Sender is one.
func TestForwards(t *testing.T) {
	store := newDir(t)
	q := outboxmemory.New(&outboxmemory.Config{Name: "q1"})
	s := newSender(t, q, &claimcheck.SenderConfig{Store: store})
	if !outbox.KeepsKeyOrder(s) {
		t.Error("KeepsKeyOrder = false over a KeyOrderer")
	}
	if p, ok := s.(outbox.Pinger); !ok || p.Ping(context.Background()) != nil {
		t.Error("not a Pinger over a Pinger")
	}
	if d, ok := s.(outbox.Describer); !ok || d.MessagingSystem() != "memory" || d.DestinationName(outbox.Message{}) != "q1" {
		t.Error("not the wrapped Describer")
	}
	s = newSender(t, bare{q}, &claimcheck.SenderConfig{Store: store})
	_, pings := s.(outbox.Pinger)
	_, describes := s.(outbox.Describer)
	if outbox.KeepsKeyOrder(s) || pings || describes {
		t.Errorf("over a bare Sender: KeepsKeyOrder %v, Pinger %v, Describer %v; want none", outbox.KeepsKeyOrder(s), pings, describes)
	}
}

type limited struct {
	*outboxmemory.Queue
}

func (limited) MaxMessageBytes() int { return 100 }

// TestLimiterIsTheDefaultThreshold: a Sender that declares its limit never sees a body over it.
func TestLimiterIsTheDefaultThreshold(t *testing.T) {
	q := outboxmemory.New(&outboxmemory.Config{SendHook: func(m outbox.Message) error {
		if len(m.Body) > 100 {
			return errors.New("saw a body over the declared limit")
		}
		return nil
	}})
	s := newSender(t, limited{q}, &claimcheck.SenderConfig{Store: newDir(t)})
	if err := s.Send(context.Background(), []outbox.Message{message(t, "", 500)}); err != nil {
		t.Fatal(err)
	}
}

// TestResolve: the consumer's handler sees the body; a missing blob, or a reference to
// another store, is a dead letter of kind blob-missing whose reason names the reference;
// neither the dead letters nor the log hold a body.
func TestResolve(t *testing.T) {
	store := newDir(t)
	q := outboxmemory.New(nil)
	s := newSender(t, q, &claimcheck.SenderConfig{Store: store, Threshold: 100})
	fine, gone, foreign := message(t, "", 5000), message(t, "", 6000), message(t, "", 10)
	foreign.Headers = map[string]string{claimcheck.Header: "https://elsewhere.example/blob"}
	if err := s.Send(context.Background(), []outbox.Message{fine, gone, foreign}); err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(context.Background(), claimcheck.Key(gone.ID)); err != nil {
		t.Fatal(err)
	}
	dlq := &outboxtest.DeadLetters{}
	var logs syncBuffer
	c, err := consumer.New(q, &consumer.Config{Name: "test", DeadLetters: dlq, Middleware: []consumer.Middleware{claimcheck.Resolve(store)},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []outbox.Event[doc]
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[doc]) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, e)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	outboxtest.WaitFor(t, 10*time.Second, "one handled and two dead letters", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1 && len(dlq.Entries()) == 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got[0].ID != fine.ID || len(got[0].Payload.Text) != 5000 || got[0].Headers[claimcheck.Header] != "" {
		t.Fatalf("handled %s with %d bytes of text and dataref %q, want %s with 5000 and none", got[0].ID, len(got[0].Payload.Text), got[0].Headers[claimcheck.Header], fine.ID)
	}
	if out := logs.String(); !strings.Contains(out, "blob-missing") || strings.Contains(out, "xxxx") {
		t.Errorf("the consumer's log does not name the dead letters' kind, or holds a body:\n%s", out)
	}
	for _, e := range dlq.Entries() {
		if e.Kind != deadletter.KindBlobMissing || !strings.Contains(e.Reason, e.Message.Headers[claimcheck.Header]) || strings.Contains(e.Reason, "xxxx") {
			t.Errorf("dead letter %s: kind %q, reason %q; want blob-missing naming the reference", e.Message.ID, e.Kind, e.Reason)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the consumer's concurrent log lines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

type unreachable struct{ claimcheck.BlobStore }

func (unreachable) Get(context.Context, string) ([]byte, error) {
	return nil, errors.New("connection refused")
}

// TestResolveStoreDown: a store that cannot be read is not the message's fault.
func TestResolveStoreDown(t *testing.T) {
	store := newDir(t)
	m := message(t, "", 10)
	m.Headers = map[string]string{claimcheck.Header: store.Ref(claimcheck.Key(m.ID))}
	called := false
	err := claimcheck.Resolve(unreachable{store})(func(context.Context, outbox.Message) error { called = true; return nil })(context.Background(), m)
	if called || !outbox.IsUnavailable(err) {
		t.Fatalf("Resolve over an unreachable store = %v (handler called: %v), want unavailable", err, called)
	}
}

// TestSweep proves the clean-up rule: a blob is deleted once it is older than the
// retention, never before; a re-send renews it.
func TestSweep(t *testing.T) {
	outboxtest.ExerciseSweep(t, newDir(t))
}
