package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"

	avail "github.com/txoutbox/outbox/internal/availability"
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
	s.UnavailableSince, s.Err = c.avail.Status()
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

// availability follows whether the consumer's dependencies answer (an
// availability.Gate), and remembers which messages failed for unavailability: any delivery
// reports how it ended, a failure marked unavailable pauses the consumer (Run stops
// receiving), a success resumes it. While paused, Run receives one message per backoff as a
// probe.
type availability struct {
	*avail.Gate

	mu     sync.Mutex
	outage map[uuid.UUID]int // deliveries of a message that failed for unavailability
}

func (a *availability) init(c *Consumer) {
	a.Gate = &avail.Gate{
		Backoff: c.cfg.UnavailableBackoff, MaxBackoff: c.cfg.MaxUnavailableBackoff,
		Log: c.obs.log, Prefix: "consumer: a dependency is",
		Down:     "unavailable; pausing receives (no attempts are counted, nothing is dead-lettered), probing with one message",
		OnChange: c.stateChanged,
	}
	a.Gate.Init()
	a.outage = map[uuid.UUID]int{}
}

// failed records that a delivery of message id (probe: the probe) failed with err, an
// unavailability: the consumer pauses if it was not paused.
func (a *availability) failed(ctx context.Context, id uuid.UUID, probe bool, err error) {
	if id != uuid.Nil {
		a.mu.Lock()
		if len(a.outage) >= maxOutageCounts {
			clear(a.outage)
		}
		a.outage[id]++
		a.mu.Unlock()
	}
	a.Failed(ctx, probe, err)
}

// ok records that a delivery of message id (probe: the probe) succeeded: what the
// consumer depends on answers, and it resumes if it was paused.
func (a *availability) ok(ctx context.Context, id uuid.UUID, probe bool) {
	a.forget(id)
	a.OK(ctx, probe)
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
