package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/claimcheck"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
)

// ExerciseBlobStore runs the conformance suite of a claimcheck.BlobStore. newStore is
// called once per subtest and must return an empty store of its own (a bucket, container,
// prefix or directory).
func ExerciseBlobStore(t *testing.T, newStore func(t *testing.T) claimcheck.BlobStore) {
	t.Helper()
	ctx := context.Background()
	t.Run("PutGetDelete", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		body := make([]byte, 1<<20)
		for i := range body {
			body[i] = byte(i * 7)
		}
		key, empty := claimcheck.Key(uuid.New()), claimcheck.Key(uuid.New())
		if err := s.Put(ctx, key, body); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(ctx, empty, nil); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, key); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("Get = %d bytes, %v; want the %d bytes put", len(got), err, len(body))
		}
		if got, err := s.Get(ctx, empty); err != nil || len(got) != 0 {
			t.Fatalf("Get of an empty blob = %d bytes, %v", len(got), err)
		}
		if err := s.Put(ctx, key, []byte("replaced")); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, key); err != nil || string(got) != "replaced" {
			t.Fatalf("Get after a second Put = %q, %v; want the new body", got, err)
		}
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, claimcheck.ErrNotFound) {
			t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, key); err != nil {
			t.Fatalf("Delete of a missing blob = %v, want nil", err)
		}
	})
	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		_, err := s.Get(ctx, claimcheck.Key(uuid.New()))
		if !errors.Is(err, claimcheck.ErrNotFound) {
			t.Fatalf("Get of a missing blob = %v, want ErrNotFound", err)
		}
	})
	t.Run("ListAndRef", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		before := time.Now()
		want := map[string]int64{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			key := claimcheck.Key(uuid.New())
			mu.Lock()
			want[key] = int64(i * 100)
			mu.Unlock()
			wg.Go(func() { errs <- s.Put(ctx, key, bytes.Repeat([]byte{'b'}, i*100)) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		got := map[string]claimcheck.Blob{}
		if err := s.List(ctx, func(b claimcheck.Blob) bool { got[b.Key] = b; return true }); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("List gave %d blobs, want %d", len(got), len(want))
		}
		for key, size := range want {
			b := got[key]
			// The store's clock may differ from ours a little; a minute is plenty.
			if b.Size != size || b.Modified.Before(before.Add(-time.Minute)) || b.Modified.After(time.Now().Add(time.Minute)) {
				t.Errorf("List: %s is %+v, want size %d, modified about now", key, b, size)
			}
		}
		seen := 0
		if err := s.List(ctx, func(claimcheck.Blob) bool { seen++; return false }); err != nil || seen != 1 {
			t.Errorf("List stopped by yield saw %d blobs, %v; want 1", seen, err)
		}
		key := claimcheck.Key(uuid.New())
		if ref := s.Ref(key); ref != s.Ref("")+key || !strings.Contains(ref, ":") {
			t.Errorf("Ref(%s) = %q, want a URI that is Ref(\"\") + key", key, ref)
		}
	})
	t.Run("Context", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := s.Put(done, claimcheck.Key(uuid.New()), []byte("x")); err == nil {
			t.Error("Put with a cancelled context succeeded")
		}
	})
	t.Run("Sweep", func(t *testing.T) { t.Parallel(); ExerciseSweep(t, newStore(t)) })
}

// ExerciseSweep proves the clean-up rule on store (empty): claimcheck.Sweep deletes
// exactly the blobs last written before its cutoff, so with cutoff = now − retention a blob
// lives at least the retention and is gone once it is older.
func ExerciseSweep(t *testing.T, store claimcheck.BlobStore) {
	t.Helper()
	ctx := context.Background()
	keys := []string{claimcheck.Key(uuid.New()), claimcheck.Key(uuid.New())}
	for _, k := range keys {
		if err := store.Put(ctx, k, []byte("body")); err != nil {
			t.Fatal(err)
		}
	}
	var oldest, newest time.Time
	if err := store.List(ctx, func(b claimcheck.Blob) bool {
		if oldest.IsZero() || b.Modified.Before(oldest) {
			oldest = b.Modified
		}
		if b.Modified.After(newest) {
			newest = b.Modified
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	// Every blob is younger than the retention: none goes.
	if n, err := claimcheck.Sweep(ctx, store, oldest); err != nil || n != 0 {
		t.Fatalf("Sweep with the cutoff at the oldest blob's time deleted %d, %v; want 0", n, err)
	}
	for _, k := range keys {
		if _, err := store.Get(ctx, k); err != nil {
			t.Fatalf("blob %s gone before its time: %v", k, err)
		}
	}
	// The retention has passed for every blob: all go.
	if n, err := claimcheck.Sweep(ctx, store, newest.Add(time.Second)); err != nil || n != len(keys) {
		t.Fatalf("Sweep past the newest blob's time deleted %d, %v; want %d", n, err, len(keys))
	}
	for _, k := range keys {
		if _, err := store.Get(ctx, k); !errors.Is(err, claimcheck.ErrNotFound) {
			t.Fatalf("blob %s after the sweep: %v, want ErrNotFound", k, err)
		}
	}
}

// ExerciseClaimCheck proves the claim check end to end over a transport, with a directory
// as the blob store: a 5 MiB event (and a small one beside it) goes through outbox, relay,
// broker and consumer, is handled typed and exactly once through the adapter's Idempotent,
// though the relay sent it twice (as after a crash before its write-back); its blob is
// removed by claimcheck.Sweep once older than the retention. A message the transport refuses
// as too large goes by reference without any threshold or declared limit, and a blob that is
// gone is a dead letter of kind blob-missing. newFixture is called once per subtest and must return a
// fresh outbox and destination, with Idempotent set.
func ExerciseClaimCheck(t *testing.T, newFixture func(t *testing.T) *PipelineFixture) {
	t.Helper()
	t.Run("FiveMiBExactlyOnce", func(t *testing.T) {
		t.Parallel()
		r := newClaimCheckRig(t, newFixture(t), 64<<10)
		big := outbox.New(Note{Text: strings.Repeat("claim check ", 5<<20/12+1)}, outbox.WithKey("file-1"))
		small := outbox.New(Note{Text: "small"})
		r.publishAndRelay(big, small)
		r.resend(big.ID) // a relay that died before its write-back sends the event again
		if keys := r.blobs(); len(keys) != 1 || keys[0] != claimcheck.Key(big.ID) {
			t.Fatalf("blobs %v after two sends, want one, named after the event", keys)
		}
		copies := 2
		if r.f.Dedup {
			copies = 1
		}
		r.consume(func() bool { return r.handled(big.ID) == 1 && r.handled(small.ID) == 1 && r.acked(big.ID) >= copies })
		if got := r.payload(big.ID); got != big.Payload.Text {
			t.Fatalf("handled a %d-byte text, want the %d bytes published", len(got), len(big.Payload.Text))
		}
		if n := r.handled(big.ID); n != 1 {
			t.Fatalf("the big event was handled %d times, want exactly once", n)
		}
		r.noDeadLetters()
		// Clean-up: kept while younger than the retention, gone once older.
		const retention = 24 * time.Hour
		if n, err := claimcheck.Sweep(context.Background(), r.store, time.Now().Add(-retention)); err != nil || n != 0 {
			t.Fatalf("a sweep within the retention deleted %d blobs, %v; want 0", n, err)
		}
		later := time.Now().Add(retention + time.Second)
		if n, err := claimcheck.Sweep(context.Background(), r.store, later.Add(-retention)); err != nil || n != 1 {
			t.Fatalf("a sweep past the retention deleted %d blobs, %v; want 1", n, err)
		}
		if keys := r.blobs(); len(keys) != 0 {
			t.Fatalf("blobs %v left after the sweep", keys)
		}
	})
	t.Run("OverTheTransportLimit", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		// Without a threshold, and without the Sender's declared limit (claimcheck.Limiter):
		// the body goes by reference only once the transport refused it as too large.
		f.Sender = sendOnly{f.Sender}
		r := newClaimCheckRig(t, f, 0)
		big := outbox.New(Note{Text: strings.Repeat("x", 2<<20)}, outbox.WithKey("file-2"))
		r.publishAndRelay(big)
		t.Logf("the transport took the 2 MiB event %s", map[bool]string{true: "by reference", false: "whole"}[len(r.blobs()) == 1])
		r.consume(func() bool { return r.handled(big.ID) == 1 })
		if got := r.payload(big.ID); got != big.Payload.Text {
			t.Fatalf("handled a %d-byte text, want the %d bytes published", len(got), len(big.Payload.Text))
		}
		r.noDeadLetters()
	})
	t.Run("BlobMissing", func(t *testing.T) {
		t.Parallel()
		r := newClaimCheckRig(t, newFixture(t), 64<<10)
		big := outbox.New(Note{Text: strings.Repeat("y", 100<<10)})
		r.publishAndRelay(big)
		if err := r.store.Delete(context.Background(), claimcheck.Key(big.ID)); err != nil {
			t.Fatal(err)
		}
		var dl []deadletter.Entry
		r.consume(func() bool {
			var err error
			dl, err = r.f.DeadLetters.List(context.Background(), deadletter.Filter{Consumer: "claimcheck"})
			if err != nil {
				t.Fatal(err)
			}
			return len(dl) == 1
		})
		e := dl[0]
		ref := r.store.Ref(claimcheck.Key(big.ID))
		if e.Message.ID != big.ID || e.Kind != deadletter.KindBlobMissing || !strings.Contains(e.Reason, ref) || e.Attempts != 1 {
			t.Fatalf("dead letter: id %s, kind %q, reason %q, attempts %d; want %s, blob-missing naming %s, 1", e.Message.ID, e.Kind, e.Reason, e.Attempts, big.ID, ref)
		}
		if n := r.handled(big.ID); n != 0 {
			t.Fatalf("the handler ran %d times without its body", n)
		}
	})
}

// sendOnly hides every method of a Sender but Send.
type sendOnly struct{ s outbox.Sender }

func (s sendOnly) Send(ctx context.Context, msgs []outbox.Message) error { return s.s.Send(ctx, msgs) }

// claimCheckRig is one pipeline with the claim check on both sides.
type claimCheckRig struct {
	t      *testing.T
	f      *PipelineFixture
	store  *claimcheck.Dir
	sender outbox.Sender
	sent   map[uuid.UUID]outbox.Message

	mu       sync.Mutex
	payloads map[uuid.UUID]string
	runs     map[uuid.UUID]int
	acks     map[uuid.UUID]int
}

func newClaimCheckRig(t *testing.T, f *PipelineFixture, threshold int) *claimCheckRig {
	t.Helper()
	if f.Idempotent == nil {
		t.Fatal("ExerciseClaimCheck needs PipelineFixture.Idempotent")
	}
	if f.Timeout == 0 {
		f.Timeout = 60 * time.Second
	}
	store, err := claimcheck.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := claimcheck.NewSender(f.Sender, &claimcheck.SenderConfig{Store: store, Threshold: threshold})
	if err != nil {
		t.Fatal(err)
	}
	return &claimCheckRig{t: t, f: f, store: store, sender: s, sent: map[uuid.UUID]outbox.Message{},
		payloads: map[uuid.UUID]string{}, runs: map[uuid.UUID]int{}, acks: map[uuid.UUID]int{}}
}

// recorder keeps what the relay sends, to send it again.
type recorder struct {
	outbox.Sender
	r *claimCheckRig
}

func (s recorder) Send(ctx context.Context, msgs []outbox.Message) error {
	for _, m := range msgs {
		s.r.sent[m.ID] = m
	}
	return s.Sender.Send(ctx, msgs)
}

func (r *claimCheckRig) publishAndRelay(events ...outbox.Encodable) {
	r.t.Helper()
	ctx := context.Background()
	if err := r.f.Publish(ctx, events...); err != nil {
		r.t.Fatal(err)
	}
	rl, err := relay.New(r.f.Store, recorder{r.sender, r}, &relay.Config{Logger: discardLogger})
	if err != nil {
		r.t.Fatal(err)
	}
	got := 0
	WaitFor(r.t, r.f.Timeout, "the relay to send", func() bool {
		n, err := rl.RunOnce(ctx)
		if err != nil {
			r.t.Fatal(err)
		}
		got += n
		return got >= len(events)
	})
}

func (r *claimCheckRig) resend(id uuid.UUID) {
	r.t.Helper()
	m, ok := r.sent[id]
	if !ok {
		r.t.Fatalf("message %s was not sent", id)
	}
	if err := r.sender.Send(context.Background(), []outbox.Message{m}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *claimCheckRig) blobs() []string {
	r.t.Helper()
	var keys []string
	if err := r.store.List(context.Background(), func(b claimcheck.Blob) bool { keys = append(keys, b.Key); return true }); err != nil {
		r.t.Fatal(err)
	}
	return keys
}

// consume runs a consumer with claimcheck.Resolve and the adapter's Idempotent until done.
func (r *claimCheckRig) consume(done func() bool) {
	r.t.Helper()
	c, err := consumer.New(ackCounter{r.f.Receiver, r}, &consumer.Config{Name: "claimcheck", DeadLetters: r.f.DeadLetters,
		MaxAttempts: 3, RetryBackoff: time.Second, MaxRetryBackoff: 2 * time.Second, Logger: discardLogger,
		Middleware: []consumer.Middleware{claimcheck.Resolve(r.store)}})
	if err != nil {
		r.t.Fatal(err)
	}
	consumer.Handle(c, r.f.Idempotent(func(ctx context.Context, e outbox.Event[Note]) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.runs[e.ID]++
		r.payloads[e.ID] = e.Payload.Text
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- c.Run(ctx) }()
	WaitFor(r.t, r.f.Timeout, "the consumer to settle the messages", done)
	cancel()
	if err := <-stopped; err != nil {
		r.t.Fatal(err)
	}
}

func (r *claimCheckRig) handled(id uuid.UUID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

func (r *claimCheckRig) acked(id uuid.UUID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acks[id]
}

func (r *claimCheckRig) payload(id uuid.UUID) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.payloads[id]
}

func (r *claimCheckRig) noDeadLetters() {
	r.t.Helper()
	dl, err := r.f.DeadLetters.List(context.Background(), deadletter.Filter{})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range dl {
		r.t.Errorf("dead letter %s: %s: %s", e.Message.ID, e.Kind, e.Reason)
	}
}

// ackCounter counts the acknowledged deliveries of each event.
type ackCounter struct {
	outbox.Receiver
	r *claimCheckRig
}

func (a ackCounter) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	ds, err := a.Receiver.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = countedAck{d, a.r}
	}
	return ds, err
}

type countedAck struct {
	outbox.Delivery
	r *claimCheckRig
}

func (d countedAck) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if m, merr := d.Delivery.Message(); err == nil && merr == nil {
		d.r.mu.Lock()
		d.r.acks[m.ID]++
		d.r.mu.Unlock()
	}
	return err
}
