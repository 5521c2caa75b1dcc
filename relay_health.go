package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txoutbox/outbox/internal/telemetry"
)

// RelayState is what a [Relay] knows of itself and of what it depends on: whether it runs,
// and since when its broker or its database has been unavailable. [Relay.State] returns it;
// RelayConfig.OnStateChange receives it on every change.
type RelayState struct {
	// Running is true while Run runs.
	Running bool
	// BrokerUnavailableSince is when sends began to fail for reasons of the broker or the
	// connection ([IsUnavailable]); zero while the broker is available. Meanwhile the relay
	// sends nothing but a probe of one message per backoff, and counts no attempt.
	BrokerUnavailableSince time.Time
	// BrokerErr is the error of the latest failed send or probe while the broker is
	// unavailable. It is the transport's text, which may name hosts: do not show it to
	// people who should not see them.
	BrokerErr error
	// DatabaseUnavailableSince is when claims or write-backs began to fail; zero while the
	// database is available.
	DatabaseUnavailableSince time.Time
	// DatabaseErr is the latest error while the database is unavailable (the driver's text,
	// as BrokerErr).
	DatabaseErr error
}

// Healthy reports whether the relay runs with its broker and database available.
func (s RelayState) Healthy() bool {
	return s.Running && s.BrokerUnavailableSince.IsZero() && s.DatabaseUnavailableSince.IsZero()
}

// State returns the relay's state now.
func (r *Relay) State() RelayState {
	s := RelayState{Running: r.running.Load()}
	s.BrokerUnavailableSince, s.BrokerErr = r.broker.status()
	s.DatabaseUnavailableSince, s.DatabaseErr = r.database.status()
	return s
}

// availability follows one thing the relay depends on (the broker, or the database): when
// it became unavailable, and when the relay's loops may try it again. While it is
// unavailable, one loop at a time probes it once the backoff has passed; the others wait
// for it to come back (or for the next probe, should the prober be gone).
type availability struct {
	name string // "broker" or "database", in logs and metrics
	r    *Relay

	mu       sync.Mutex
	since    time.Time     // zero: available
	err      error         // the latest failure while unavailable
	failures int           // consecutive failed probes, for the backoff
	probeAt  time.Time     // when the next probe may start
	probing  bool          // a loop is probing
	back     chan struct{} // closed when available again
	// Changes are logged up to 10 a minute (a broker that flaps would fill the logs), and
	// "still unavailable" once a minute.
	changes, still telemetry.LogLimiter
}

func (a *availability) init(name string, r *Relay) {
	a.name, a.r = name, r
	a.changes = telemetry.LogLimiter{Burst: 10, Window: time.Minute}
	a.still = telemetry.LogLimiter{Burst: 1, Window: time.Minute}
}

func (a *availability) status() (time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.since, a.err
}

// admit says whether a loop may go on now: at once while available; while unavailable,
// once the backoff has passed and no other loop probes (probe is then true: the loop is the
// prober and must report with failed, ok or idle). Otherwise it returns how long to wait at
// most before asking again, and a channel closed if the thing comes back meanwhile.
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
		// Should the prober never report (it cannot: every path reports), the next
		// backoff lets another loop probe.
		wait = max(wait, a.r.cfg.UnavailableBackoff)
	}
	return false, false, wait, a.back
}

// failed records that an attempt (a probe, or any loop's work while it was available)
// failed with err: unavailable from now on, if it was not, and the next probe after a
// backoff that grows with each failed probe.
func (a *availability) failed(ctx context.Context, probe bool, err error) {
	a.mu.Lock()
	now := time.Now()
	changed := a.since.IsZero()
	if changed {
		a.since, a.failures, a.back = now, 0, make(chan struct{})
	}
	a.err = err
	if changed || probe {
		a.failures++
		a.probeAt = now.Add(Backoff(a.failures, a.r.cfg.UnavailableBackoff, a.r.cfg.MaxUnavailableBackoff))
	}
	if probe {
		a.probing = false
	}
	since, next := a.since, a.probeAt.Sub(now)
	a.mu.Unlock()
	switch {
	case changed:
		a.logChange(ctx, slog.LevelError, "unavailable; pausing, no attempts are counted",
			slog.Duration("next_probe_in", next.Round(time.Millisecond)), slog.Any("err", err))
		a.r.stateChanged(ctx)
	case probe:
		if ok, suppressed := a.still.Allow(); ok {
			attrs := []slog.Attr{slog.Duration("unavailable_for", now.Sub(since).Round(time.Second)),
				slog.Duration("next_probe_in", next.Round(time.Millisecond)), slog.Any("err", err)}
			if suppressed > 0 {
				attrs = append(attrs, slog.Int("probes_not_logged", suppressed))
			}
			a.r.obs.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: "+a.name+" still unavailable", attrs...)
		}
	}
}

// logChange logs a change of availability, rate-limited.
func (a *availability) logChange(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	ok, suppressed := a.changes.Allow()
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("changes_not_logged", suppressed))
	}
	a.r.obs.log.LogAttrs(ctx, level, "outbox relay: "+a.name+" "+msg, attrs...)
}

// ok records that the thing answered: available again, if it was not.
func (a *availability) ok(ctx context.Context, probe bool) {
	a.mu.Lock()
	if probe {
		a.probing = false
	}
	if a.since.IsZero() {
		a.mu.Unlock()
		return
	}
	since := a.since
	a.since, a.err, a.failures = time.Time{}, nil, 0
	close(a.back)
	a.mu.Unlock()
	a.logChange(ctx, slog.LevelWarn, "available again", slog.Duration("unavailable_for", time.Since(since).Round(time.Millisecond)))
	a.r.stateChanged(ctx)
}

// idle records that a probe found nothing to try with (an empty outbox): the next probe
// comes after the same backoff.
func (a *availability) idle(probe bool) {
	if !probe {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probing = false
	a.probeAt = time.Now().Add(Backoff(max(a.failures, 1), a.r.cfg.UnavailableBackoff, a.r.cfg.MaxUnavailableBackoff))
}

// stateChanged calls OnStateChange with the state now.
func (r *Relay) stateChanged(ctx context.Context) {
	if r.cfg.OnStateChange != nil {
		r.cfg.OnStateChange(ctx, r.State())
	}
}

// observeAvailability registers the txoutbox.relay.unavailable gauge and returns its
// unregistration.
func (t *relayTelemetry) observeAvailability(r *Relay) func() {
	broker := metric.WithAttributeSet(attribute.NewSet(telemetry.ComponentKey.String("broker"), telemetry.RelayKey.String(r.cfg.Name)))
	database := metric.WithAttributeSet(attribute.NewSet(telemetry.ComponentKey.String("database"), telemetry.RelayKey.String(r.cfg.Name)))
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		now := time.Now()
		s := r.State()
		o.ObserveFloat64(t.inst.Unavailable, age(now, s.BrokerUnavailableSince), broker)
		o.ObserveFloat64(t.inst.Unavailable, age(now, s.DatabaseUnavailableSince), database)
		return nil
	}, t.inst.Unavailable)
	if err != nil {
		t.log.Warn("outbox relay: the availability gauge is unavailable", "err", err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}
