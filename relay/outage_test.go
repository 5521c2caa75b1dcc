package relay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// listStore is a Store over a slice, for the relay's own tests (the adapters' stores are
// tested by outboxtest's conformance suite): it claims due rows in order, without keys'
// rules, and records the limits it was asked for.
type listStore struct {
	mu        sync.Mutex
	rows      []*listRow
	limits    []int
	claimErr  error
	validate  func() error
	dead      []outboxdriver.DeadLetter
	completed int
}

type listRow struct {
	seq       int64
	msg       outbox.Message
	err       error // an unreadable row
	attempts  int
	token     int64
	due       time.Time
	firstFail time.Time
}

func newListStore(n int) *listStore {
	s := &listStore{}
	for i := range n {
		m, _ := outbox.New(testPayload{}).Encode()
		s.rows = append(s.rows, &listRow{seq: int64(i + 1), msg: m})
	}
	return s
}

func (s *listStore) Claim(_ context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claimErr != nil {
		return nil, s.claimErr
	}
	s.limits = append(s.limits, p.Limit)
	var out []outboxdriver.Claimed
	waiting := map[string]bool{} // keys with an earlier row leased or not due: as a real store, no claim takes a row behind one
	for _, r := range s.rows {
		if len(out) == p.Limit {
			break
		}
		if r.token != 0 || time.Now().Before(r.due) || waiting[r.msg.Key] {
			if r.msg.Key != "" {
				waiting[r.msg.Key] = true
			}
			continue
		}
		r.token = p.Token
		r.attempts++
		out = append(out, outboxdriver.Claimed{Seq: r.seq, Attempts: r.attempts, Message: r.msg, FirstFailedAt: r.firstFail, Err: r.err})
	}
	return out, nil
}

func (s *listStore) each(token int64, seqs []int64, fn func(i int, r *listRow)) {
	for i := 0; i < len(s.rows); i++ {
		if r := s.rows[i]; r.token == token && slices.Contains(seqs, r.seq) {
			fn(i, r)
		}
	}
}

func (s *listStore) remove(seq int64) {
	s.rows = slices.DeleteFunc(s.rows, func(r *listRow) bool { return r.seq == seq })
}

func (s *listStore) Complete(_ context.Context, token int64, seqs []int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var done []int64
	s.each(token, seqs, func(_ int, r *listRow) { done = append(done, r.seq) })
	for _, seq := range done {
		s.remove(seq)
	}
	s.completed += len(done)
	return nil
}

func (s *listStore) Retry(_ context.Context, token int64, rs []outboxdriver.Retry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rt := range rs {
		s.each(token, []int64{rt.Seq}, func(_ int, r *listRow) {
			r.token, r.due = 0, time.Now().Add(rt.Delay)
			if r.firstFail.IsZero() {
				r.firstFail = time.Now()
			}
		})
	}
	return nil
}

func (s *listStore) DeadLetter(_ context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var moved []int64
	for _, d := range dead {
		s.each(token, []int64{d.Seq}, func(_ int, r *listRow) { moved = append(moved, r.seq) })
	}
	for _, seq := range moved {
		s.remove(seq)
	}
	s.dead = append(s.dead, dead...)
	return moved, nil
}

func (s *listStore) Release(_ context.Context, token int64, seqs []int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.each(token, seqs, func(_ int, r *listRow) { r.token, r.attempts = 0, r.attempts-1 })
	return nil
}

func (s *listStore) Validate(context.Context) error {
	if s.validate == nil {
		return nil
	}
	return s.validate()
}

func (s *listStore) snapshot() (left, completed int, dead []outboxdriver.DeadLetter, limits []int, attempts []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		attempts = append(attempts, r.attempts)
	}
	return len(s.rows), s.completed, slices.Clone(s.dead), slices.Clone(s.limits), attempts
}

// unleasedAttempts returns the attempts counted on the rows no claim holds: a row that a
// running relay holds may carry the attempt of a claim in flight, which its Release takes
// back.
func (s *listStore) unleasedAttempts() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []int{0}
	for _, r := range s.rows {
		if r.token == 0 {
			out = append(out, r.attempts)
		}
	}
	return out
}

// switchableSender fails every send as a stopped broker would while down is set.
type switchableSender struct {
	down  atomic.Bool
	sent  atomic.Int64
	calls atomic.Int64
	err   error
}

func (s *switchableSender) Send(_ context.Context, msgs []outbox.Message) error {
	s.calls.Add(1)
	if s.down.Load() {
		if s.err != nil {
			return s.err
		}
		return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	s.sent.Add(int64(len(msgs)))
	return nil
}

func quickRelay(t *testing.T, store outboxdriver.Store, sender outbox.Sender, cfg *relay.Config) *relay.Relay {
	t.Helper()
	if cfg == nil {
		cfg = &relay.Config{}
	}
	cfg.Name = "test"
	cfg.MaxAttempts = max(cfg.MaxAttempts, 3)
	cfg.MinPollInterval, cfg.MaxPollInterval = time.Millisecond, 5*time.Millisecond
	cfg.RetryBackoff, cfg.MaxRetryBackoff = time.Millisecond, 2*time.Millisecond
	cfg.UnavailableBackoff, cfg.MaxUnavailableBackoff = time.Millisecond, 10*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := relay.New(store, sender, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBrokerOutageSpendsNoAttempts: a network error from the Sender pauses the relay, which
// probes with claims of one message; no message's attempt is spent, nothing is
// dead-lettered, State and OnStateChange follow, and everything goes once the broker is back.
func TestBrokerOutageSpendsNoAttempts(t *testing.T) {
	store := newListStore(50)
	sender := &switchableSender{}
	sender.down.Store(true)
	var (
		mu      sync.Mutex
		changes []relay.State
	)
	r := quickRelay(t, store, sender, &relay.Config{BatchSize: 10, OnStateChange: func(_ context.Context, s relay.State) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, s)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	waitUntil(t, "many probes while the broker is down", func() bool { return sender.calls.Load() > 20 })
	st := r.State()
	if !st.Running || st.BrokerUnavailableSince.IsZero() || !errors.Is(st.BrokerErr, syscall.ECONNREFUSED) || st.Healthy() {
		t.Fatalf("state during the outage = %+v", st)
	}
	left, _, dead, limits, _ := store.snapshot()
	if left != 50 || len(dead) != 0 {
		t.Fatalf("during the outage: %d rows left, %d dead letters; want 50, 0", left, len(dead))
	}
	if attempts := store.unleasedAttempts(); slices.Max(attempts) != 0 {
		t.Fatalf("attempts were counted during the outage: %v", attempts)
	}
	// After the first failed batch, claims are probes of one message.
	if n := len(limits); n < 10 || slices.Max(limits[n/2:]) != 1 {
		t.Fatalf("claim limits during the outage = %v, want probes of 1", limits)
	}
	sender.down.Store(false)
	waitUntil(t, "everything to be delivered after the outage", func() bool { _, c, _, _, _ := store.snapshot(); return c == 50 })
	if st := r.State(); !st.Healthy() || st.BrokerErr != nil {
		t.Fatalf("state after the outage = %+v", st)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 2 || changes[0].BrokerUnavailableSince.IsZero() || !changes[1].BrokerUnavailableSince.IsZero() {
		t.Fatalf("OnStateChange calls = %+v, want down then up", changes)
	}
	if r.State().Running {
		t.Fatal("State().Running after Run returned")
	}
}

// TestSendTimeoutIsTheBrokers: a Send that outlives SendTimeout is the broker's failure.
func TestSendTimeoutIsTheBrokers(t *testing.T) {
	store := newListStore(3)
	block := make(chan struct{})
	sender := senderFunc(func(ctx context.Context, msgs []outbox.Message) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-block:
			return nil
		}
	})
	r := quickRelay(t, store, sender, &relay.Config{Lease: 2 * time.Second, SendTimeout: 50 * time.Millisecond})
	n, err := r.RunOnce(context.Background())
	close(block)
	if n != 3 || !errors.Is(err, outbox.ErrUnavailable) || !strings.Contains(err.Error(), "SendTimeout") {
		t.Fatalf("RunOnce = %d, %v; want 3 and an unavailable broker", n, err)
	}
	if _, _, dead, _, attempts := store.snapshot(); len(dead) != 0 || slices.Max(attempts) != 0 {
		t.Fatalf("a timed-out send spent attempts %v or dead-lettered %v", attempts, dead)
	}
}

type senderFunc func(ctx context.Context, msgs []outbox.Message) error

func (f senderFunc) Send(ctx context.Context, msgs []outbox.Message) error { return f(ctx, msgs) }

// TestMessageFailuresStillCount: an error the transport attributes to a message (not
// unavailable) is retried and dead-lettered after MaxAttempts, as before.
func TestMessageFailuresStillCount(t *testing.T) {
	store := newListStore(2)
	sender := senderFunc(func(context.Context, []outbox.Message) error { return errors.New("rejected: invalid attribute") })
	r := quickRelay(t, store, sender, &relay.Config{MaxAttempts: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	waitUntil(t, "both messages to be dead-lettered", func() bool { _, _, d, _, _ := store.snapshot(); return len(d) == 2 })
	_, _, dead, _, _ := store.snapshot()
	if dead[0].Kind != "gave-up" || !strings.Contains(dead[0].Reason, "gave up after 3 attempts") {
		t.Fatalf("dead letter = %+v", dead[0])
	}
	if !r.State().BrokerUnavailableSince.IsZero() {
		t.Fatal("a message's own failure made the broker unavailable")
	}
}

// TestMaxRetryTime: a message failing on its own past MaxRetryTime since its first failure
// is dead-lettered with attempts left.
func TestMaxRetryTime(t *testing.T) {
	store := newListStore(1)
	sender := senderFunc(func(context.Context, []outbox.Message) error { return errors.New("rejected") })
	r := quickRelay(t, store, sender, &relay.Config{MaxAttempts: 1000, MaxRetryTime: 30 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	waitUntil(t, "the message to be dead-lettered by time", func() bool { _, _, d, _, _ := store.snapshot(); return len(d) == 1 })
	_, _, dead, _, _ := store.snapshot()
	if !strings.Contains(dead[0].Reason, "MaxRetryTime 30ms") {
		t.Fatalf("reason = %q", dead[0].Reason)
	}
}

// TestPingClearsAnOutageWithNothingToSend: a relay whose probe finds the outbox empty (another
// relay drained it) asks a Pinger instead, and reports the broker available again.
func TestPingClearsAnOutageWithNothingToSend(t *testing.T) {
	store := newListStore(1)
	sender := &pingSender{}
	sender.down.Store(true)
	r := quickRelay(t, store, sender, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	waitUntil(t, "the broker to be reported unavailable", func() bool { return !r.State().BrokerUnavailableSince.IsZero() })
	store.mu.Lock()
	store.rows = nil // drained by someone else
	claims := len(store.limits)
	store.mu.Unlock()
	// A probe that claimed the row before it went may still be sending it; once a claim
	// has found the outbox empty, that probe is over, and a send can no longer be what
	// clears the outage when the broker comes back.
	waitUntil(t, "a probe to find the outbox empty", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.limits) > claims
	})
	sender.down.Store(false)
	waitUntil(t, "a ping to report the broker available", func() bool { return r.State().Healthy() })
	if sender.pings.Load() == 0 {
		t.Fatal("no ping")
	}
}

type pingSender struct {
	switchableSender
	pings atomic.Int64
}

func (p *pingSender) Ping(context.Context) error {
	p.pings.Add(1)
	if p.down.Load() {
		return outbox.Unavailable(errors.New("connection refused"))
	}
	return nil
}

// TestDatabaseOutage: failing claims make the database unavailable (State, no busy loop);
// the first claim that works clears it.
func TestDatabaseOutage(t *testing.T) {
	store := newListStore(5)
	store.claimErr = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	sender := &switchableSender{}
	r := quickRelay(t, store, sender, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	waitUntil(t, "the database to be reported unavailable", func() bool { return !r.State().DatabaseUnavailableSince.IsZero() })
	store.mu.Lock()
	store.claimErr = nil
	store.mu.Unlock()
	waitUntil(t, "delivery after the database is back", func() bool { return sender.sent.Load() == 5 })
	waitUntil(t, "the database to be reported available", func() bool { return r.State().Healthy() })
}

// TestRunFailsFastOnAnUnmigratedSchema: a Validator's ErrSchema stops Run at once; other
// validation errors (the database is down) are waited out.
func TestRunFailsFastOnAnUnmigratedSchema(t *testing.T) {
	store := newListStore(0)
	var calls atomic.Int64
	store.validate = func() error {
		if calls.Add(1) < 3 {
			return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		return fmt.Errorf("relation \"outbox\" does not exist: %w", outbox.ErrSchema)
	}
	r := quickRelay(t, store, &switchableSender{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := r.Run(ctx)
	if !errors.Is(err, outbox.ErrSchema) || ctx.Err() != nil || calls.Load() != 3 {
		t.Fatalf("Run = %v after %d validations (ctx %v); want ErrSchema after 3", err, calls.Load(), ctx.Err())
	}
	// A claim that finds the schema missing stops Run too.
	store.validate = nil
	store.claimErr = fmt.Errorf("function outbox_claim does not exist: %w", outbox.ErrSchema)
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrSchema) || ctx.Err() != nil {
		t.Fatalf("Run = %v, want ErrSchema from the claim", err)
	}
}

// TestIsUnavailable classifies errors.
func TestIsUnavailable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("invalid attribute"), false},
		{outbox.Unavailable(errors.New("throttled")), true},
		{fmt.Errorf("send: %w", outbox.Unavailable(errors.New("no responders"))), true},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{fmt.Errorf("post: %w", syscall.ECONNRESET), true},
		{&net.DNSError{Err: "no such host", Name: "broker"}, true},
		{outbox.Permanent(outbox.Unavailable(errors.New("both"))), false},
		{fmt.Errorf("%w", outbox.ErrTooLarge), false},
		{context.DeadlineExceeded, false}, // the caller's deadline says nothing of the server
		{fmt.Errorf("handler: %w", context.DeadlineExceeded), false},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, true}, // an I/O timeout is the server's
	} {
		if got := outbox.IsUnavailable(tc.err); got != tc.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if outbox.Unavailable(nil) != nil {
		t.Error("Unavailable(nil) is not nil")
	}
}

// TestMemoryQueueHookOutage: the in-memory transport's SendHook returning an unavailable
// error (as in the reproduction) spends no attempt.
func TestMemoryQueueHookOutage(t *testing.T) {
	store := newListStore(5)
	var down atomic.Bool
	down.Store(true)
	q := outboxmemory.New(&outboxmemory.Config{SendHook: func(outbox.Message) error {
		if down.Load() {
			return fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
		}
		return nil
	}})
	r := quickRelay(t, store, q, &relay.Config{MaxAttempts: 3})
	for range 10 {
		if _, err := r.RunOnce(context.Background()); !errors.Is(err, outbox.ErrUnavailable) {
			t.Fatalf("RunOnce during the outage = %v, want ErrUnavailable", err)
		}
	}
	down.Store(false)
	if n, err := r.RunOnce(context.Background()); n != 5 || err != nil {
		t.Fatalf("RunOnce after the outage = %d, %v", n, err)
	}
	if left, c, dead, _, _ := store.snapshot(); left != 0 || c != 5 || len(dead) != 0 {
		t.Fatalf("left %d, completed %d, dead %d", left, c, len(dead))
	}
}

// TestUnreadableRowHoldsItsKeyInTheClaim: a row dead-lettered before the send (unreadable, or
// claimed too often) holds its key at once: the key's later rows in the same claim are given
// back unsent, while other keys go on.
func TestUnreadableRowHoldsItsKeyInTheClaim(t *testing.T) {
	store := &listStore{}
	for i, key := range []string{"a", "a", "b"} {
		m, _ := outbox.New(testPayload{}, outbox.WithKey(key)).Encode()
		r := &listRow{seq: int64(i + 1), msg: m}
		if i == 0 {
			r.err = errors.New("headers: not a JSON object")
		}
		store.rows = append(store.rows, r)
	}
	q := outboxmemory.New(nil)
	r := quickRelay(t, store, q, nil)
	if _, err := r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	sent := q.Sent()
	if len(sent) != 1 || sent[0].Key != "b" {
		t.Fatalf("sent %d messages (%v), want only key b's", len(sent), sent)
	}
	_, _, dead, _, _ := store.snapshot()
	if len(dead) != 1 || !dead[0].HoldKey || dead[0].Seq != 1 {
		t.Fatalf("dead letters = %+v, want row 1 holding its key", dead)
	}
}
