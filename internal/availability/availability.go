// Package availability follows whether something the relay or the consumer depends on — a
// broker, a database — answers: since when it has not, and when to try it again. While it
// is unavailable, one caller at a time probes it once a backoff has passed (exponential,
// with jitter, capped); the others wait until it is back, or until the next probe is due.
// Both the relay (one gate for its broker, one for its database) and the consumer (one for
// what its handlers and dead-letter table depend on) pause on a Gate.
package availability

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/txoutbox/outbox/internal/backoff"
	"github.com/txoutbox/outbox/internal/telemetry"
)

// Gate is the availability of one dependency. Its zero value is not usable: set the exported
// fields, then call Init.
type Gate struct {
	// Backoff and MaxBackoff bound the pause before each probe: Backoff after the first
	// failure, doubling with each failed probe up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
	// Log receives the gate's lines, each message prefixed with Prefix ("outbox relay:
	// broker"): a change (unavailable, available again) at most 10 times a minute, should it
	// flap, and "still unavailable" once a minute while probes fail.
	Log    *slog.Logger
	Prefix string
	// Down is the message of the change to unavailable ("unavailable; pausing, no attempts
	// are counted").
	Down string
	// OnChange, when set, is called after each change, outside the gate's lock.
	OnChange func(ctx context.Context)

	mu       sync.Mutex
	since    time.Time     // zero: available
	err      error         // the latest failure while unavailable
	failures int           // consecutive failed probes, for the backoff
	probeAt  time.Time     // when the next probe may start
	probing  bool          // a caller is probing
	back     chan struct{} // closed when available again

	changes, still telemetry.LogLimiter
}

// Init readies g once its fields are set.
func (g *Gate) Init() {
	g.changes = telemetry.LogLimiter{Burst: 10, Window: time.Minute}
	g.still = telemetry.LogLimiter{Burst: 1, Window: time.Minute}
}

// Status returns since when the dependency has been unavailable (zero: it is available) and
// the latest error meanwhile.
func (g *Gate) Status() (since time.Time, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.since, g.err
}

// Admit says whether a caller may go on now: at once while available; while unavailable,
// once the backoff has passed and no other caller probes (probe is then true: the caller is
// the prober and must report with Failed, OK or Inconclusive). Otherwise it returns how long
// to wait at most before asking again, and a channel closed if the dependency comes back
// meanwhile.
func (g *Gate) Admit() (proceed, probe bool, wait time.Duration, back <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.since.IsZero() {
		return true, false, 0, nil
	}
	now := time.Now()
	if !g.probing && !now.Before(g.probeAt) {
		g.probing = true
		return true, true, 0, nil
	}
	wait = g.probeAt.Sub(now)
	if g.probing {
		// Should the prober never report, the next backoff lets another caller probe.
		wait = max(wait, g.Backoff)
	}
	return false, false, wait, g.back
}

// Wait blocks until a caller may go on (probe: as the prober) or ctx ends (ok false).
func (g *Gate) Wait(ctx context.Context) (probe, ok bool) {
	for {
		proceed, probe, wait, back := g.Admit()
		if proceed {
			return probe, true
		}
		Pause(ctx, wait, back)
		if ctx.Err() != nil {
			return false, false
		}
	}
}

// Pause waits for wait, for back to close, or for ctx to end.
func Pause(ctx context.Context, wait time.Duration, back <-chan struct{}) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-back:
	case <-t.C:
	}
}

// Delay is the current backoff: how long until about the next probe.
func (g *Gate) Delay() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return backoff.Delay(max(g.failures, 1), g.Backoff, g.MaxBackoff)
}

// Failed records that a call (probe: the probe, or any caller's while it was available)
// failed with err: unavailable from now on, if it was not, and the next probe after a
// backoff that grows with each failed probe.
func (g *Gate) Failed(ctx context.Context, probe bool, err error) {
	g.mu.Lock()
	now := time.Now()
	changed := g.since.IsZero()
	if changed {
		g.since, g.failures, g.back = now, 0, make(chan struct{})
	}
	g.err = err
	if changed || probe {
		g.failures++
		g.probeAt = now.Add(backoff.Delay(g.failures, g.Backoff, g.MaxBackoff))
	}
	if probe {
		g.probing = false
	}
	since, next := g.since, g.probeAt.Sub(now)
	g.mu.Unlock()
	switch {
	case changed:
		g.logChange(ctx, slog.LevelError, g.Down, slog.Duration("next_probe_in", next.Round(time.Millisecond)), slog.Any("err", err))
		if g.OnChange != nil {
			g.OnChange(ctx)
		}
	case probe:
		if ok, suppressed := g.still.Allow(); ok {
			attrs := []slog.Attr{slog.Duration("unavailable_for", now.Sub(since).Round(time.Second)),
				slog.Duration("next_probe_in", next.Round(time.Millisecond)), slog.Any("err", err)}
			if suppressed > 0 {
				attrs = append(attrs, slog.Int("probes_not_logged", suppressed))
			}
			g.Log.LogAttrs(ctx, slog.LevelWarn, g.Prefix+" still unavailable", attrs...)
		}
	}
}

// OK records that a call (probe: the probe) succeeded: available again, if it was not.
func (g *Gate) OK(ctx context.Context, probe bool) {
	g.mu.Lock()
	if probe {
		g.probing = false
	}
	if g.since.IsZero() {
		g.mu.Unlock()
		return
	}
	since := g.since
	g.since, g.err, g.failures = time.Time{}, nil, 0
	close(g.back)
	g.mu.Unlock()
	g.logChange(ctx, slog.LevelWarn, "available again", slog.Duration("unavailable_for", time.Since(since).Round(time.Millisecond)))
	if g.OnChange != nil {
		g.OnChange(ctx)
	}
}

// Inconclusive records that a probe (when probe is true) told nothing of the dependency
// (there was nothing to try it with, or the call failed for a reason of its own): the next
// probe comes after the same backoff.
func (g *Gate) Inconclusive(probe bool) {
	if !probe {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	if !g.since.IsZero() {
		g.probeAt = time.Now().Add(backoff.Delay(max(g.failures, 1), g.Backoff, g.MaxBackoff))
	}
}

// logChange logs a change of availability, rate-limited.
func (g *Gate) logChange(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	ok, suppressed := g.changes.Allow()
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("changes_not_logged", suppressed))
	}
	g.Log.LogAttrs(ctx, level, g.Prefix+" "+msg, attrs...)
}
