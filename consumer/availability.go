package consumer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/telemetry"
)

// State is what a [Consumer] knows of itself: whether it runs, and since when what its
// handlers or its dead-letter table depend on has been unavailable. [Consumer.State]
// returns it; Config.OnStateChange receives it on every change.
type State struct {
	// Running is true while Run runs.
	Running bool
	// UnavailableSince is when deliveries began to fail for reasons of a database, a
	// broker or a service rather than of the message: a handler error that
	// [outbox.IsUnavailable] reports (the inbox database down, an error a handler marked
	// with [outbox.Unavailable]), a dead-letter table that could not be written, or a held
	// key that could not be looked up. Zero while available. Meanwhile the consumer
	// receives nothing but a probe of one message per backoff, and counts no attempt.
	UnavailableSince time.Time
	// Err is the latest such error while unavailable. It is the driver's or the handler's
	// text, which may name hosts: do not show it to people who should not see them.
	Err error
}

// Healthy reports whether the consumer runs with what it depends on available.
func (s State) Healthy() bool { return s.Running && s.UnavailableSince.IsZero() }

// State returns the consumer's state now.
func (c *Consumer) State() State {
	s := State{Running: c.isRunning.Load()}
	c.avail.mu.Lock()
	s.UnavailableSince, s.Err = c.avail.since, c.avail.err
	c.avail.mu.Unlock()
	return s
}

// stateChanged calls OnStateChange with the state now.
func (c *Consumer) stateChanged(ctx context.Context) {
	if c.cfg.OnStateChange != nil {
		c.cfg.OnStateChange(ctx, c.State())
	}
}

// maxOutageCounts bounds the deliveries remembered as failed for unavailability: past it
// the memory starts again (a message then loses its discount, see discount).
const maxOutageCounts = 1 << 16

// availability follows whether the consumer's dependencies answer. Any delivery reports
// how it ended: a failure marked unavailable pauses the consumer (Run stops receiving),
// a success resumes it. While paused, Run receives one message per backoff as a probe;
// the backoff grows with each probe that fails the same way.
type availability struct {
	c *Consumer

	mu       sync.Mutex
	since    time.Time     // zero: available
	err      error         // the latest failure while unavailable
	failures int           // consecutive failed probes, for the backoff
	probeAt  time.Time     // when the next probe may start
	probing  bool          // a probe's delivery is being handled
	back     chan struct{} // closed when available again
	outage   map[uuid.UUID]int
	log      telemetry.LogLimiter // probes still failing: one line a minute
	turns    telemetry.LogLimiter // pauses and resumptions: a few a minute, should they flap
}

func (a *availability) init(c *Consumer) {
	a.c = c
	a.log = telemetry.LogLimiter{Burst: 1, Window: time.Minute}
	a.turns = telemetry.LogLimiter{Burst: 4, Window: time.Minute}
	a.outage = map[uuid.UUID]int{}
}

// admit says whether Run may receive now: at once while available; while unavailable,
// once the backoff has passed and no probe is in flight (probe is then true: receive one
// message, and mark it as the probe). Otherwise it returns how long to wait at most before
// asking again, and a channel closed if the consumer resumes meanwhile.
func (a *availability) admit() (proceed, probe bool, wait time.Duration, back <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.since.IsZero() {
		return true, false, 0, nil
	}
	now := time.Now()
	if !a.probing && !now.Before(a.probeAt) {
		a.probing = true
		return true, true, 0, nil
	}
	wait = a.probeAt.Sub(now)
	if a.probing {
		// The probe may wait behind its key; should it never report, the next backoff
		// sends another.
		wait = max(wait, a.c.cfg.UnavailableBackoff)
	}
	return false, false, wait, a.back
}

// delay is how long to nack a delivery that failed for unavailability: until about the
// next probe.
func (a *availability) delay() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return backoff.Delay(max(a.failures, 1), a.c.cfg.UnavailableBackoff, a.c.cfg.MaxUnavailableBackoff)
}

// failed records that a delivery of message id (probe: the probe) failed with err, an
// unavailability: the consumer pauses if it was not paused, and the next probe comes after
// a backoff that grows with each failed probe.
func (a *availability) failed(ctx context.Context, id uuid.UUID, probe bool, err error) {
	a.mu.Lock()
	if id != uuid.Nil {
		if len(a.outage) >= maxOutageCounts {
			clear(a.outage)
		}
		a.outage[id]++
	}
	now := time.Now()
	changed := a.since.IsZero()
	if changed {
		a.since, a.failures, a.back = now, 0, make(chan struct{})
	}
	a.err = err
	if changed || probe {
		a.failures++
		a.probeAt = now.Add(backoff.Delay(a.failures, a.c.cfg.UnavailableBackoff, a.c.cfg.MaxUnavailableBackoff))
	}
	if probe {
		a.probing = false
	}
	since, next := a.since, a.probeAt.Sub(now)
	a.mu.Unlock()
	log := a.c.obs.log
	switch {
	case changed:
		if ok, suppressed := a.turns.Allow(); ok {
			attrs := []slog.Attr{slog.Duration("next_probe_in", next.Round(time.Millisecond)), slog.Any("err", err)}
			if suppressed > 0 {
				attrs = append(attrs, slog.Int("not_logged", suppressed))
			}
			log.LogAttrs(ctx, slog.LevelError, "consumer: a dependency is unavailable; pausing receives (no attempts are counted, nothing is dead-lettered), probing with one message", attrs...)
		}
		a.c.stateChanged(ctx)
	case probe:
		if ok, suppressed := a.log.Allow(); ok {
			attrs := []slog.Attr{slog.Duration("unavailable_for", now.Sub(since).Round(time.Second)),
				slog.Duration("next_probe_in", next.Round(time.Millisecond)), slog.Any("err", err)}
			if suppressed > 0 {
				attrs = append(attrs, slog.Int("probes_not_logged", suppressed))
			}
			log.LogAttrs(ctx, slog.LevelWarn, "consumer: still unavailable", attrs...)
		}
	}
}

// ok records that a delivery of message id (probe: the probe) succeeded: what the
// consumer depends on answers, and it resumes if it was paused.
func (a *availability) ok(ctx context.Context, id uuid.UUID, probe bool) {
	a.mu.Lock()
	if probe {
		a.probing = false
	}
	if len(a.outage) > 0 {
		delete(a.outage, id)
	}
	if a.since.IsZero() {
		a.mu.Unlock()
		return
	}
	since := a.since
	a.since, a.err, a.failures = time.Time{}, nil, 0
	close(a.back)
	a.mu.Unlock()
	if ok, _ := a.turns.Allow(); ok {
		a.c.obs.log.LogAttrs(ctx, slog.LevelWarn, "consumer: available again; receiving",
			slog.Duration("unavailable_for", time.Since(since).Round(time.Millisecond)))
	}
	a.c.stateChanged(ctx)
}

// inconclusive records that a delivery (probe: the probe) ended in a way that says nothing
// of the outage (its handler failed for a reason of its own, or shutdown interrupted it):
// a probe is then sent again after the same backoff.
func (a *availability) inconclusive(probe bool) {
	if !probe {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probing = false
	if !a.since.IsZero() {
		a.probeAt = time.Now().Add(backoff.Delay(max(a.failures, 1), a.c.cfg.UnavailableBackoff, a.c.cfg.MaxUnavailableBackoff))
	}
}

// discount returns attempt less the deliveries of message id that this process saw fail
// for unavailability: the broker counts those too (SQS ApproximateReceiveCount, JetStream's
// delivery count…), and an outage must not spend a message's MaxAttempts.
func (a *availability) discount(id uuid.UUID, attempt int) int {
	a.mu.Lock()
	n := a.outage[id]
	a.mu.Unlock()
	return max(attempt-n, 1)
}

// forget drops what was remembered of message id once it is settled for good.
func (a *availability) forget(id uuid.UUID) {
	a.mu.Lock()
	if len(a.outage) > 0 {
		delete(a.outage, id)
	}
	a.mu.Unlock()
}

// wait blocks until Run may receive (probe: as the probe) or ctx ends (ok false).
func (a *availability) wait(ctx context.Context) (probe, ok bool) {
	for {
		proceed, probe, wait, back := a.admit()
		if proceed {
			return probe, true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, false
		case <-back:
		case <-t.C:
		}
		t.Stop()
	}
}
