// Package outboxmemory is an in-process transport: a [Queue] is both the relay's Sender and a
// consumer's Receiver. It is for tests and examples (nothing survives the process), and it
// behaves like a real broker where that matters to them: redelivery after a visibility
// timeout, delivery counts, optional per-key FIFO and dedup by message ID, and injectable
// send and ping failures (Config.SendHook, Config.PingHook).
package outboxmemory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/config"
)

// Config configures a [Queue]; nil means the defaults.
type Config struct {
	// Name names the queue in traces and metrics (messaging.destination.name). Optional.
	Name string
	// FIFO delivers a key's messages one at a time in send order: the next is not received
	// while one is in flight.
	FIFO bool
	// DedupWindow drops a message whose ID was accepted within the window (like SQS FIFO's
	// five minutes). 0 disables dedup.
	DedupWindow time.Duration
	// VisibilityTimeout is how long a received, unacknowledged message stays hidden.
	// Default 30s.
	VisibilityTimeout time.Duration
	// MaxMessageBytes rejects larger bodies with outbox.ErrTooLarge (0: no limit).
	MaxMessageBytes int
	// SendHook, when set, is called for each message before it is accepted; an error fails
	// that message. Tests use it to inject failures: an error marked outbox.Unavailable is
	// a broker outage (the relay pauses and spends no attempt), any other error the
	// message's own fault.
	SendHook func(outbox.Message) error
	// PingHook, when set, is what Ping returns. Tests set it with SendHook to play a
	// broker that is down: an error marked outbox.Unavailable keeps a relay that has
	// nothing to send paused.
	PingHook func(context.Context) error
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	config.Default(&out.VisibilityTimeout, 30*time.Second)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *Config) validate() error {
	var errs []error
	if c.VisibilityTimeout < 0 {
		errs = append(errs, fmt.Errorf("VisibilityTimeout %v is negative", c.VisibilityTimeout))
	}
	if c.DedupWindow < 0 {
		errs = append(errs, fmt.Errorf("DedupWindow %v is negative", c.DedupWindow))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is negative", c.MaxMessageBytes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxmemory: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}

// Queue is an in-memory queue. The zero value is not usable; call [New].
type Queue struct {
	cfg *Config

	mu       sync.Mutex
	ready    []*entry // accepted, in send order; ready[:head] are all acknowledged
	head     int
	live     int                  // accepted and not yet acknowledged
	seen     map[string]time.Time // DedupID → when accepted
	sent     []outbox.Message     // everything accepted, for tests
	inFlight map[string]bool      // FIFO: keys with a message out
	notify   chan struct{}        // closed and replaced when messages arrive or reappear
}

type entry struct {
	msg       outbox.Message
	attempts  int
	visibleAt time.Time
	receipt   uint64 // changes on every receive; a stale Ack is ignored
	done      bool
}

// New returns an empty queue configured by cfg (nil means the defaults). An invalid cfg (a
// negative field) panics: the queue is for tests and examples, where that is a mistake in
// the code rather than in a deployment's settings.
func New(cfg *Config) *Queue {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		panic(err)
	}
	return &Queue{cfg: c, seen: map[string]time.Time{}, inFlight: map[string]bool{}, notify: make(chan struct{})}
}

// Send accepts msgs, in order. Messages over MaxMessageBytes, or failed by SendHook, are
// reported in an *outbox.BatchError, and so is every later message of their key in msgs,
// not accepted (the queue keeps key order: [Queue.KeepsKeyOrder]); so is what is left once ctx
// is done; the others are accepted.
func (q *Queue) Send(ctx context.Context, msgs []outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	failed := map[int]error{}
	var failedKeys map[string]bool // keys with a failed message: their later ones fail unsent
	fail := func(i int, err error) {
		failed[i] = err
		if k := msgs[i].Key; k != "" {
			if failedKeys == nil {
				failedKeys = map[string]bool{}
			}
			failedKeys[k] = true
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	for i, m := range msgs {
		if err := ctx.Err(); err != nil { // out of time (a slow SendHook): the rest is not sent
			fail(i, err)
			continue
		}
		if m.Key != "" && failedKeys[m.Key] {
			fail(i, fmt.Errorf("outboxmemory: message %s not sent: an earlier message of key %q failed in this call", m.ID, m.Key))
			continue
		}
		if q.cfg.MaxMessageBytes > 0 && len(m.Body) > q.cfg.MaxMessageBytes {
			fail(i, fmt.Errorf("outboxmemory: message %s is %d bytes, over the limit of %d: %w", m.ID, len(m.Body), q.cfg.MaxMessageBytes, outbox.ErrTooLarge))
			continue
		}
		if q.cfg.SendHook != nil {
			if err := q.cfg.SendHook(m); err != nil {
				fail(i, err)
				continue
			}
		}
		if q.cfg.DedupWindow > 0 {
			if at, ok := q.seen[m.DedupID()]; ok && now.Sub(at) < q.cfg.DedupWindow {
				continue // accepted as a duplicate: the broker says OK and keeps one copy
			}
			q.seen[m.DedupID()] = now
		}
		q.ready = append(q.ready, &entry{msg: m})
		q.live++
		q.sent = append(q.sent, m)
	}
	q.wakeLocked()
	if len(failed) > 0 {
		return &outbox.BatchError{Failed: failed}
	}
	return nil
}

// KeepsKeyOrder reports true ([outbox.KeyOrderer]): Send accepts a key's messages in the
// order given and none after one that failed, so the relay sends a key's run in one call.
func (q *Queue) KeepsKeyOrder() bool { return true }

// Ping reports whether the queue answers ([outbox.Pinger]): always, unless ctx is done or
// Config.PingHook says otherwise.
func (q *Queue) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if q.cfg.PingHook != nil {
		return q.cfg.PingHook(ctx)
	}
	return nil
}

func (q *Queue) wakeLocked() {
	close(q.notify)
	q.notify = make(chan struct{})
}

// Sent returns a copy of every message the queue accepted, in order (dedup'd copies
// excluded).
func (q *Queue) Sent() []outbox.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]outbox.Message(nil), q.sent...)
}

// Len returns how many messages are not yet acknowledged.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.live
}

// Receive waits until at least one message is visible or ctx ends, and returns up to max.
func (q *Queue) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	if max < 1 {
		max = 1
	}
	for {
		q.mu.Lock()
		out, next := q.takeLocked(max)
		wait := q.notify
		q.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		if err := waitFor(ctx, wait, next); err != nil {
			return nil, err
		}
	}
}

// waitFor blocks until wait is closed, the time next (if set) arrives, or ctx ends.
func waitFor(ctx context.Context, wait <-chan struct{}, next time.Time) error {
	var timer <-chan time.Time
	if !next.IsZero() {
		t := time.NewTimer(time.Until(next))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-wait:
	case <-timer:
	}
	return nil
}

// takeLocked hands out up to max visible messages and returns when the next hidden one
// becomes visible.
func (q *Queue) takeLocked(max int) ([]outbox.Delivery, time.Time) {
	now := time.Now()
	var out []outbox.Delivery
	var next time.Time
	blocked := map[string]bool{}
	// Skip the acknowledged prefix, and drop it once it is half the slice (amortised O(1)),
	// so a receive looks only at messages in flight and the ones it hands out.
	for q.head < len(q.ready) && q.ready[q.head].done {
		q.ready[q.head] = nil
		q.head++
	}
	if q.head > 1024 && 2*q.head > len(q.ready) {
		q.ready = append([]*entry(nil), q.ready[q.head:]...)
		q.head = 0
	}
	for _, e := range q.ready[q.head:] {
		if len(out) == max {
			break
		}
		if e.done {
			continue
		}
		k := e.msg.Key
		if q.cfg.FIFO && k != "" && blocked[k] {
			continue
		}
		if e.visibleAt.After(now) {
			if next.IsZero() || e.visibleAt.Before(next) {
				next = e.visibleAt
			}
			if q.cfg.FIFO && k != "" {
				blocked[k] = true // an earlier message of this key is out: keep order
			}
			continue
		}
		if q.cfg.FIFO && k != "" {
			blocked[k] = true
		}
		e.attempts++
		e.receipt++
		e.visibleAt = now.Add(q.cfg.VisibilityTimeout)
		out = append(out, &delivery{q: q, e: e, receipt: e.receipt})
	}
	return out, next
}

type delivery struct {
	q       *Queue
	e       *entry
	receipt uint64
}

func (d *delivery) Message() (outbox.Message, error) { return d.e.msg, nil }

func (d *delivery) Attempt() int {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	return d.e.attempts
}

// Ack removes the message; a stale delivery (the message was received again after its
// visibility timeout) is rejected like a broker rejects an old receipt.
func (d *delivery) Ack(ctx context.Context) error {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	if d.e.receipt != d.receipt || d.e.done {
		return fmt.Errorf("outboxmemory: ack of message %s with a stale receipt", d.e.msg.ID)
	}
	d.e.done = true
	d.q.live--
	d.q.wakeLocked()
	return nil
}

func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	if d.e.receipt != d.receipt || d.e.done {
		return fmt.Errorf("outboxmemory: nack of message %s with a stale receipt", d.e.msg.ID)
	}
	d.e.visibleAt = time.Now().Add(delay)
	d.q.wakeLocked()
	return nil
}

var (
	_ outbox.Sender   = (*Queue)(nil)
	_ outbox.Pinger   = (*Queue)(nil)
	_ outbox.Receiver = (*Queue)(nil)
)

// MessagingSystem returns "memory", for telemetry ([outbox.Describer]).
func (q *Queue) MessagingSystem() string { return "memory" }

// DestinationName returns the queue's Name (Config.Name), "" by default.
func (q *Queue) DestinationName(outbox.Message) string { return q.cfg.Name }
