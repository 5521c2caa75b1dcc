package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// runnerStore is a listStore with work of its own (outboxdriver.Runner): it records the
// wake it was given and returns fail, or nil once ctx ends.
type runnerStore struct {
	*listStore
	woken chan func()
	fail  error
}

func (s *runnerStore) Run(ctx context.Context, wake func()) error {
	s.woken <- wake
	if s.fail != nil {
		return s.fail
	}
	<-ctx.Done()
	return nil
}

// TestRunRunsTheStoresRunner: Relay.Run runs a Runner store's Run with the relay's Wake,
// waits for it when ctx ends, and stops with its error when it fails.
func TestRunRunsTheStoresRunner(t *testing.T) {
	s := &runnerStore{listStore: newListStore(0), woken: make(chan func(), 1)}
	r, err := relay.New(s, outboxmemory.New(nil), &relay.Config{MaxPollInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	wake := <-s.woken
	wake() // the relay's Wake: never blocks
	wake()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after ctx ended: %v", err)
	}

	broken := errors.New("the log is gone")
	s = &runnerStore{listStore: newListStore(0), woken: make(chan func(), 1), fail: broken}
	r, err = relay.New(s, outboxmemory.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); !errors.Is(err, broken) {
		t.Fatalf("Run with a failing Runner: %v, want its error", err)
	}
}
