package relay

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txoutbox/outbox/internal/availability"
	"github.com/txoutbox/outbox/internal/telemetry"
)

// State is what a [Relay] knows of itself and of what it depends on: whether it runs,
// and since when its broker or its database has been unavailable. [Relay.State] returns it;
// Config.OnStateChange receives it on every change.
type State struct {
	// Running is true while Run runs.
	Running bool
	// BrokerUnavailableSince is when sends began to fail for reasons of the broker or the
	// connection ([outbox.IsUnavailable]); zero while the broker is available. Meanwhile the relay
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
func (s State) Healthy() bool {
	return s.Running && s.BrokerUnavailableSince.IsZero() && s.DatabaseUnavailableSince.IsZero()
}

// State returns the relay's state now.
func (r *Relay) State() State {
	s := State{Running: r.running.Load()}
	s.BrokerUnavailableSince, s.BrokerErr = r.broker.Status()
	s.DatabaseUnavailableSince, s.DatabaseErr = r.database.Status()
	return s
}

// gate returns the availability gate of one thing the relay depends on (name: "broker" or
// "database").
func (r *Relay) gate(name string) availability.Gate {
	return availability.Gate{
		Backoff: r.cfg.UnavailableBackoff, MaxBackoff: r.cfg.MaxUnavailableBackoff,
		Log: r.obs.log, Prefix: "outbox relay: " + name, Down: "unavailable; pausing, no attempts are counted",
		OnChange: r.stateChanged,
	}
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
	attrs := func(component string) metric.MeasurementOption {
		kv := append([]attribute.KeyValue{telemetry.ComponentKey.String(component), telemetry.RelayKey.String(r.cfg.Name)}, r.cfg.outboxAttrs()...)
		return metric.WithAttributeSet(attribute.NewSet(kv...))
	}
	broker, database := attrs("broker"), attrs("database")
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
