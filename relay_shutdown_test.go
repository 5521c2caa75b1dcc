package outbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/txoutbox/outbox"
)

// slowClaimStore claims two rows; the claim commits, then, if the caller's context has
// ended by the time it would return, reports that as its error, as a database driver does
// when a cancellation races a statement that already committed.
type slowClaimStore struct {
	claiming chan struct{}
	proceed  chan struct{}
	mu       sync.Mutex
	released []int64
}

func (s *slowClaimStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	close(s.claiming)
	<-s.proceed
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []outboxdriver.Claimed
	for seq := int64(1); seq <= 2; seq++ {
		m, _ := outbox.New(testPayload{}).Encode()
		out = append(out, outboxdriver.Claimed{Seq: seq, Attempts: 1, Message: m})
	}
	return out, nil
}

func (s *slowClaimStore) Complete(context.Context, int64, []int64) error     { return nil }
func (s *slowClaimStore) Retry(context.Context, int64, []outboxdriver.Retry) error { return nil }
func (s *slowClaimStore) DeadLetter(context.Context, int64, []outboxdriver.DeadLetter) ([]int64, error) {
	return nil, nil
}
func (s *slowClaimStore) Release(_ context.Context, _ int64, seqs []int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, seqs...)
	return nil
}

type testPayload struct{}

func (testPayload) EventType() string { return "test.payload" }

type noSender struct{ sent int }

func (s *noSender) Send(_ context.Context, msgs []outbox.Message) error {
	s.sent += len(msgs)
	return nil
}

// TestShutdownDuringClaimReleasesTheClaim: a relay stopped while its claim is in flight
// releases the rows that claim leased, instead of leaving them leased until the lease
// expires, and sends none of them.
func TestShutdownDuringClaimReleasesTheClaim(t *testing.T) {
	t.Parallel()
	store := &slowClaimStore{claiming: make(chan struct{}), proceed: make(chan struct{})}
	sender := &noSender{}
	relay, err := relay.New(store, sender, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := relay.RunOnce(ctx); done <- err }()
	<-store.claiming
	cancel()
	close(store.proceed)
	if err := <-done; err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if !slices.Equal(store.released, []int64{1, 2}) || sender.sent != 0 {
		t.Fatalf("released %v and sent %d, want both rows released and nothing sent", store.released, sender.sent)
	}
	if _, err := relay.RunOnce(ctx); err == nil {
		t.Fatal("RunOnce with an ended context claimed")
	}
}
