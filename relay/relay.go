package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/availability"
	"github.com/txoutbox/outbox/internal/backoff"
	"github.com/txoutbox/outbox/internal/config"
	"github.com/txoutbox/outbox/outboxdriver"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Config configures a [Relay]. The zero value (or nil) means the defaults below.
type Config struct {
	// Name identifies this relay in leases and logs. Default: host name, process ID and a
	// random suffix.
	Name string
	// BatchSize is how many messages one claim leases. Default 500.
	BatchSize int
	// MaxAttempts is how many delivery attempts a message gets before it is dead-lettered.
	// Default 10.
	MaxAttempts int
	// Lease is how long a claim stays with this relay; a relay that dies is replaced by
	// another once its leases expire. Default 30s.
	Lease time.Duration
	// SendTimeout bounds one call to the Sender. It must be at most half of Lease, so a send
	// never outlives its lease. Default Lease/3.
	SendTimeout time.Duration
	// MinPollInterval is the wait after a claim that drained the outbox. Each empty claim
	// doubles the wait up to MaxPollInterval; any delivered message resets it. Defaults 1ms
	// and 100ms: millisecond latency while events flow, a handful of cheap indexed queries
	// per second while idle. [Relay.Wake] cuts any wait short.
	MinPollInterval time.Duration
	MaxPollInterval time.Duration
	// RetryBackoff is the delay before the second attempt; each attempt doubles it, with
	// jitter, up to MaxRetryBackoff. Defaults 1s and 5m.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// MaxRetryTime, when set, ends the retries of a message that keeps failing on its own:
	// a failure more than MaxRetryTime after its first one (Claimed.FirstFailedAt, by the
	// database's clock) dead-letters it even with attempts left. Either budget, MaxAttempts
	// or MaxRetryTime, ends the retries. Only failures that the transport attributes to the
	// message count: while the broker is unavailable nothing is attempted, so an outage of
	// any length dead-letters nothing, but its time does count toward MaxRetryTime of a
	// message that had failed before it and fails again after it. Default 0: attempts only.
	MaxRetryTime time.Duration
	// UnavailableBackoff is how long the relay pauses once the broker or the database is
	// unavailable (see [outbox.IsUnavailable]; for the database, any failed claim or write-back).
	// Each pause ends in a probe — one claim of one message, sent — and each failed probe
	// doubles the pause, with jitter, up to MaxUnavailableBackoff; the first probe that
	// succeeds resumes every loop. Defaults 100ms and 10s.
	UnavailableBackoff    time.Duration
	MaxUnavailableBackoff time.Duration
	// KeyPolicy says what a dead letter does to the later events of its key: HoldKey (the
	// default) makes them wait until it is replayed or discarded; SkipKey lets them go on.
	KeyPolicy KeyPolicy
	// Concurrency is how many claim → send → write-back loops run at once. With 2, one
	// loop's sends and write-backs overlap the other's claim; on PostgreSQL the loops'
	// claims of keyed events run side by side too, each starting from its own share of the
	// keys. Default 2.
	Concurrency int
	// Logger receives the relay's logs, with the event's id, type, key and attempt (never
	// its payload); failures to be retried are rate-limited (10 lines per 10s, with the
	// count of those left out). Default slog.Default().
	Logger *slog.Logger
	// TracerProvider and MeterProvider receive the relay's spans and metrics. Default: the
	// global providers (otel.SetTracerProvider…), which do nothing until the application
	// installs an OpenTelemetry SDK.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// OnDeadLetter, when set, is called once for each message the relay moves to the
	// dead-letter table, after the move committed: to page someone without polling the
	// table. See [deadletter.Notice].
	OnDeadLetter func(ctx context.Context, d deadletter.Notice)
	// OnStateChange, when set, is called each time the broker or the database becomes
	// unavailable or available again, with the new state (see [Relay.State]): to page
	// someone. It runs on a relay loop's goroutine, so it must return quickly.
	OnStateChange func(ctx context.Context, s State)

	// outbox names the outbox in a Group (Outbox.Name): an attribute of every metric.
	outbox string
}

// KeyPolicy says what becomes of a key's later events once one of its events is
// dead-lettered.
type KeyPolicy int

const (
	// HoldKey (the default) keeps per-key order across a dead letter: the key's later events
	// wait until the dead letter is replayed — it goes first — or discarded — the key moves
	// on. Held keys show in Stats.HeldKeys, `outbox status`, the console and the
	// txoutbox.outbox.held_keys gauge.
	HoldKey KeyPolicy = iota
	// SkipKey lets the key's later events go on past the dead letter; replaying it later
	// delivers it after them.
	SkipKey
)

// String names the policy.
func (p KeyPolicy) String() string {
	switch p {
	case HoldKey:
		return "hold"
	case SkipKey:
		return "skip"
	}
	return fmt.Sprintf("KeyPolicy(%d)", int(p))
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Name == "" {
		out.Name = defaultName()
	}
	config.Default(&out.BatchSize, 500)
	config.Default(&out.MaxAttempts, 10)
	config.Default(&out.Lease, 30*time.Second)
	config.Default(&out.SendTimeout, out.Lease/3)
	config.Default(&out.MinPollInterval, time.Millisecond)
	config.Default(&out.MaxPollInterval, 100*time.Millisecond)
	config.Default(&out.RetryBackoff, time.Second)
	config.Default(&out.MaxRetryBackoff, 5*time.Minute)
	config.Default(&out.UnavailableBackoff, 100*time.Millisecond)
	config.Default(&out.MaxUnavailableBackoff, 10*time.Second)
	config.Default(&out.Concurrency, 2)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// defaultName names a relay (or a Group) after its host and process, with a random suffix
// so that two in one process differ.
func defaultName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d:%04x", host, os.Getpid(), rand.IntN(1<<16))
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *Config) validate() error {
	var errs []error
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		errs = append(errs, fmt.Errorf("BatchSize %d is outside 1..10000", c.BatchSize))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("MaxAttempts %d is below 1", c.MaxAttempts))
	}
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("Lease %v is under 1s", c.Lease))
	}
	if c.SendTimeout <= 0 || c.SendTimeout > c.Lease/2 {
		errs = append(errs, fmt.Errorf("SendTimeout %v must be positive and at most half of Lease (%v)", c.SendTimeout, c.Lease))
	}
	if c.MinPollInterval <= 0 || c.MaxPollInterval < c.MinPollInterval {
		errs = append(errs, fmt.Errorf("poll intervals must satisfy 0 < MinPollInterval (%v) <= MaxPollInterval (%v)", c.MinPollInterval, c.MaxPollInterval))
	}
	if c.RetryBackoff <= 0 || c.MaxRetryBackoff < c.RetryBackoff {
		errs = append(errs, fmt.Errorf("backoffs must satisfy 0 < RetryBackoff (%v) <= MaxRetryBackoff (%v)", c.RetryBackoff, c.MaxRetryBackoff))
	}
	if c.MaxRetryTime < 0 {
		errs = append(errs, fmt.Errorf("MaxRetryTime %v is negative", c.MaxRetryTime))
	}
	if c.UnavailableBackoff <= 0 || c.MaxUnavailableBackoff < c.UnavailableBackoff {
		errs = append(errs, fmt.Errorf("backoffs must satisfy 0 < UnavailableBackoff (%v) <= MaxUnavailableBackoff (%v)", c.UnavailableBackoff, c.MaxUnavailableBackoff))
	}
	if c.KeyPolicy != HoldKey && c.KeyPolicy != SkipKey {
		errs = append(errs, fmt.Errorf("KeyPolicy %v is neither HoldKey nor SkipKey", c.KeyPolicy))
	}
	if c.Concurrency < 1 || c.Concurrency > 64 {
		errs = append(errs, fmt.Errorf("Concurrency %d is outside 1..64", c.Concurrency))
	}
	if len(errs) > 0 {
		return fmt.Errorf("relay: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}

// Relay delivers committed outbox messages to a [outbox.Sender]. Run any number of relays against
// one outbox: claims are leased, so each message is sent by one relay at a time, and
// messages with the same key are sent in order.
type Relay struct {
	store    outboxdriver.Store
	sender   outbox.Sender
	keyOrder bool // the Sender keeps key order within a call: a claim goes in one wave
	cfg      *Config
	wake     chan struct{}
	poll     chan struct{} // held by the loop that polls a drained outbox
	backlog  chan struct{} // a full batch: wakes a loop that waits for one
	running  atomic.Bool
	obs      relayTelemetry
	// broker and database follow the availability of what the relay depends on.
	broker, database *availability.Gate
	// turns is the relay's share of its Group's cycles; nil outside a Group.
	turns *fairMember
}

// New returns a relay that moves messages from store to sender. It applies cfg's defaults
// (nil means the defaults) and reports every problem of its arguments at once.
func New(store outboxdriver.Store, sender outbox.Sender, cfg *Config) (*Relay, error) {
	c := cfg.WithDefaults()
	var errs []error
	if store == nil {
		errs = append(errs, errors.New("relay: New needs a Store"))
	}
	if sender == nil {
		errs = append(errs, errors.New("relay: New needs a Sender"))
	}
	if err := c.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	r := &Relay{store: store, sender: sender, keyOrder: outbox.KeepsKeyOrder(sender), cfg: c, wake: make(chan struct{}, 1),
		poll: make(chan struct{}, 1), backlog: make(chan struct{}, 1)}
	r.obs.init(c, sender)
	broker, database := r.gate("broker"), r.gate("database")
	r.broker, r.database = &broker, &database
	r.broker.Init()
	r.database.Init()
	return r, nil
}

// Wake makes a waiting relay claim now instead of at its next poll. Call it after committing
// a transaction that published events when the relay runs in the same process; it never
// blocks.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run delivers messages until ctx ends, then returns nil once the batch in flight is sent
// (bounded by SendTimeout) and written back, or released. While the broker or the database
// is unavailable it pauses and probes (see UnavailableBackoff) for as long as that lasts.
// It returns an error if the relay is already running, if the outbox's schema is not
// migrated (an error wrapping [outbox.ErrSchema], found before the first claim when the store is a
// [outboxdriver.Validator], else by the first claim), or if the store's own work failed for
// good (an [outboxdriver.Runner]'s error).
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: Relay.Run called while the relay is running")
	}
	defer r.running.Store(false)
	if err := r.validate(ctx); err != nil {
		return err
	}
	if sr, ok := r.store.(outboxdriver.StatsReader); ok {
		defer r.obs.observeStats(sr)()
	}
	defer r.obs.observeAvailability(r)()

	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	var runErr error // the store's Runner failed: the relay stops with its error
	if rn, ok := r.store.(outboxdriver.Runner); ok {
		wg.Go(func() {
			if err := rn.Run(ctx, r.Wake); err != nil && ctx.Err() == nil {
				runErr = fmt.Errorf("outbox: relay %s: %w", r.cfg.Name, err)
				stop(runErr)
			}
		})
	}
	for lane := range r.cfg.Concurrency {
		wg.Go(func() {
			if err := r.loop(ctx, lane); err != nil {
				stop(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); errors.Is(err, outbox.ErrSchema) || (runErr != nil && err == runErr) {
		return err
	}
	return nil
}

// validate checks the outbox's schema once before the first claim, when the store can:
// waiting (as for any claim) while the database is unavailable, failing on ErrSchema.
func (r *Relay) validate(ctx context.Context) error {
	v, ok := r.store.(outboxdriver.Validator)
	if !ok {
		return nil
	}
	for ctx.Err() == nil {
		proceed, probe, wait, back := r.database.Admit()
		if !proceed {
			availability.Pause(ctx, wait, back)
			continue
		}
		var err error
		if !r.inTurn(ctx, probe, func() { // in a Group, as a claim (see loop)
			vctx, cancel := context.WithTimeout(ctx, r.cfg.SendTimeout)
			err = v.Validate(vctx)
			cancel()
		}) {
			continue // ctx ended
		}
		switch {
		case err == nil:
			r.database.OK(ctx, probe)
			return nil
		case errors.Is(err, outbox.ErrSchema):
			r.database.OK(ctx, probe)
			return fmt.Errorf("outbox: relay %s cannot start: %w", r.cfg.Name, err)
		case ctx.Err() == nil:
			r.database.Failed(ctx, probe, err)
		}
	}
	return nil
}

// admit waits, while the broker or the database is unavailable, until this loop may probe
// it or it is back. It returns false when the loop should ask again (or ctx ended).
func (r *Relay) admit(ctx context.Context) (brokerProbe, databaseProbe, ok bool) {
	proceed, brokerProbe, wait, back := r.broker.Admit()
	if !proceed {
		availability.Pause(ctx, wait, back)
		return false, false, false
	}
	proceed, databaseProbe, wait, back = r.database.Admit()
	if !proceed {
		r.broker.Inconclusive(brokerProbe)
		availability.Pause(ctx, wait, back)
		return false, false, false
	}
	return brokerProbe, databaseProbe, true
}

// loop is one claim → send → write-back loop of Run (its lane of ClaimParams), polling
// adaptively. It returns an error only for a schema that is not migrated.
func (r *Relay) loop(ctx context.Context, lane int) error {
	interval := r.cfg.MinPollInterval
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	polling := false
	state := new(outboxdriver.ClaimState) // this loop's, for its store (ClaimParams.State)
	defer func() {
		if polling {
			<-r.poll
		}
	}()
	for ctx.Err() == nil {
		brokerProbe, databaseProbe, ok := r.admit(ctx)
		if !ok {
			continue
		}
		limit := r.cfg.BatchSize
		if brokerProbe {
			limit = 1 // one message tells whether the broker is back
		}
		var c cycle
		if !r.inTurn(ctx, brokerProbe || databaseProbe, func() { c = r.runOnce(ctx, lane, limit, state) }) {
			continue // ctx ended
		}
		if c.claimErr != nil {
			r.broker.Inconclusive(brokerProbe)
			if errors.Is(c.claimErr, outbox.ErrSchema) {
				r.database.OK(ctx, databaseProbe)
				return c.claimErr
			}
			if ctx.Err() == nil {
				r.database.Failed(ctx, databaseProbe, c.claimErr)
			}
			continue
		}
		if c.writeErr != nil && ctx.Err() == nil {
			r.database.Failed(ctx, databaseProbe, c.writeErr)
		} else {
			r.database.OK(ctx, databaseProbe)
		}
		switch {
		case c.unavailable != nil:
			r.broker.Failed(ctx, brokerProbe, c.unavailable)
			continue // admit pauses the loop
		case c.answered:
			r.broker.OK(ctx, brokerProbe)
		case brokerProbe:
			if err := r.ping(ctx); err != nil {
				r.broker.Failed(ctx, true, err)
				continue
			}
		}
		n := c.claimed
		switch {
		case brokerProbe && c.answered:
			continue // the broker is back: claim whole batches again at once
		case n == r.cfg.BatchSize:
			select { // a backlog: let a waiting loop claim too
			case r.backlog <- struct{}{}:
			default:
			}
			continue // more may be waiting
		case n > 0:
			interval = r.cfg.MinPollInterval
		default:
			interval = min(interval*2, r.cfg.MaxPollInterval)
		}
		// An outbox that one claim drained is polled by one loop; the others wait for a
		// backlog (a full batch) or a Wake instead of claiming, mostly in vain, what the
		// poller has just taken.
		if !polling {
			select {
			case r.poll <- struct{}{}:
				polling = true
			default:
				select {
				case <-ctx.Done():
				case <-r.backlog:
				case <-r.wake:
				}
				continue
			}
		}
		timer.Reset(interval)
		select {
		case <-ctx.Done():
		case <-r.wake:
			interval = r.cfg.MinPollInterval
		case <-timer.C:
			continue
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
	return nil
}

// inTurn runs fn in one of the Group's turns: it waits for one, runs fn and gives it back.
// Outside a Group, and for a probe, fn runs at once: an outbox whose broker or database is
// down never holds more than the cycles that found it so. It returns false, without running
// fn, when ctx ended while it waited.
func (r *Relay) inTurn(ctx context.Context, probe bool, fn func()) bool {
	if r.turns == nil || probe {
		fn()
		return true
	}
	if !r.turns.acquire(ctx) {
		return false
	}
	defer r.turns.release()
	fn()
	return true
}

// RunOnce claims one batch, sends it and writes the outcome back. It returns how many
// messages it claimed. Run calls it in a loop; tests and one-shot jobs may call it directly.
// When the broker is unavailable ([outbox.IsUnavailable]) it gives back what it did not send,
// without counting an attempt, and returns an error wrapping [outbox.ErrUnavailable].
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	c := r.runOnce(ctx, 0, r.cfg.BatchSize, nil)
	switch {
	case c.claimErr != nil:
		return 0, c.claimErr
	case c.unavailable != nil:
		return c.claimed, errors.Join(fmt.Errorf("outbox: broker unavailable: %w", outbox.Unavailable(c.unavailable)), c.writeErr)
	}
	return c.claimed, c.writeErr
}

// cycle is what one claim → send → write-back came to.
type cycle struct {
	claimed     int
	claimErr    error // the claim failed: nothing was sent
	writeErr    error // a write-back failed
	unavailable error // a send failed for reasons of the broker: what was not sent was given back
	answered    bool  // the broker accepted a message, or refused one for reasons of its own
}

// runOnce is RunOnce as the loop of the given lane, claiming up to limit messages with the
// loop's claim state (nil for none).
func (r *Relay) runOnce(ctx context.Context, lane, limit int, state *outboxdriver.ClaimState) cycle {
	if err := ctx.Err(); err != nil {
		return cycle{claimErr: fmt.Errorf("outbox: claiming messages: %w", err)}
	}
	token := rand.Int64()
	// The claim runs to its end even when ctx ends meanwhile: a claim cancelled after its
	// commit would report an error while holding rows nobody knows to release, until their
	// lease expired. Once it returns, a cancelled ctx releases the whole batch (send).
	// A wave starts only while a whole SendTimeout still fits in the lease (measured from
	// before the claim, so on the safe side): a claim of long runs on a slow broker gives
	// back what it cannot send in time instead of sending it after another relay took it.
	lastWave := time.Now().Add(r.cfg.Lease - r.cfg.SendTimeout)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.SendTimeout)
	claimed, err := r.store.Claim(cctx, outboxdriver.ClaimParams{
		Owner: r.cfg.Name,
		Token: token,
		Limit: limit,
		Lease: r.cfg.Lease,
		Lane:  lane,
		Lanes: r.cfg.Concurrency,
		State: state,
	})
	cancel()
	if err != nil {
		return cycle{claimErr: fmt.Errorf("outbox: claiming messages: %w", err)}
	}
	if len(claimed) == 0 {
		return cycle{}
	}
	r.obs.claimed(ctx, len(claimed))
	// A message claimed more often than MaxAttempts lost its earlier leases without a
	// write-back: its sends crashed or hung the relay. Dead-letter it instead of looping.
	// A row the store could not read is dead-lettered alone; the rest of the claim goes on.
	out := outcome{holdKeys: r.cfg.KeyPolicy == HoldKey, blocked: map[string]bool{}}
	defer out.telemetry.Wait()
	sendable := claimed[:0] // filtered in place: claimed is not read again
	for _, c := range claimed {
		if c.Err != nil {
			out.deadLetter(c, deadletter.KindUnreadableRow, fmt.Sprintf("unreadable outbox row: %v", c.Err))
			continue
		}
		if c.Attempts > r.cfg.MaxAttempts {
			out.deadLetter(c, deadletter.KindGaveUp, fmt.Sprintf(
				"claimed %d times without an outcome (the relay crashed or timed out while sending it)", c.Attempts-1))
			continue
		}
		sendable = append(sendable, c)
	}
	r.send(ctx, sendable, lastWave, &out)

	// Write back even when ctx ended: the sends happened, and forgetting them only costs
	// duplicates, but releasing promptly lets another relay continue.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.SendTimeout)
	defer cancel()
	var errs []error
	if len(out.done) > 0 {
		errs = append(errs, r.store.Complete(wctx, token, out.done))
	}
	if len(out.retry) > 0 {
		errs = append(errs, r.store.Retry(wctx, token, out.retry))
	}
	if len(out.dead) > 0 {
		moved, err := r.store.DeadLetter(wctx, token, out.dead)
		errs = append(errs, err)
		r.obs.deadLettered(wctx, &out, moved)
	}
	if len(out.release) > 0 {
		errs = append(errs, r.store.Release(wctx, token, out.release))
	}
	c := cycle{claimed: len(claimed), unavailable: out.unavailable, answered: out.answered}
	if err := errors.Join(errs...); err != nil {
		c.writeErr = fmt.Errorf("outbox: writing back a batch of %d: %w", len(claimed), err)
	}
	return c
}

type outcome struct {
	done, release []int64
	retry         []outboxdriver.Retry
	dead          []outboxdriver.DeadLetter
	deadClaims    []outboxdriver.Claimed // the claims of dead, in the same order
	telemetry     sync.WaitGroup         // the sends' spans and metrics, recorded beside the write-back
	holdKeys      bool                   // KeyPolicy HoldKey: a keyed dead letter holds its key
	blocked       map[string]bool        // keys whose later messages in the claim are not sent
	unavailable   error                  // the broker's failure that stopped the sends, if any
	answered      bool                   // the broker accepted or refused a message
}

// deadLetter moves c to the dead letters; holding its key, the key's later messages in the
// claim are given back unsent.
func (o *outcome) deadLetter(c outboxdriver.Claimed, kind deadletter.Kind, reason string) {
	hold := o.holdKeys && c.Message.Key != ""
	o.dead = append(o.dead, outboxdriver.DeadLetter{Seq: c.Seq, Kind: kind, Reason: reason, HoldKey: hold})
	o.deadClaims = append(o.deadClaims, c)
	if hold {
		o.blocked[c.Message.Key] = true
	}
}

// send delivers a claim in waves: wave i holds the i-th message of every key (and, in wave
// 0, every keyless message), so a Sender never sees two messages of one key at once, and a
// key whose message failed sends nothing after it. A Sender that keeps key order
// ([outbox.KeyOrderer]) gets the whole claim in one wave, in outbox order; it fails a key's
// messages after one that failed, and those are given back like the later waves of the key.
// Waves due after lastWave are released, and so is everything left once the broker turns
// out to be unavailable.
func (r *Relay) send(ctx context.Context, claimed []outboxdriver.Claimed, lastWave time.Time, out *outcome) {
	waves := [][]outboxdriver.Claimed{claimed}
	if !r.keyOrder {
		waves = splitWaves(claimed)
	}
	blocked := out.blocked
	for _, wave := range waves {
		batch := wave[:0] // filtered in place: the wave is not read again
		for _, c := range wave {
			if c.Message.Key != "" && blocked[c.Message.Key] {
				out.release = append(out.release, c.Seq)
				continue
			}
			batch = append(batch, c)
		}
		if len(batch) == 0 {
			continue
		}
		// Shutting down, out of lease, or the broker is down: give the rest back untouched.
		if ctx.Err() != nil || time.Now().After(lastWave) || out.unavailable != nil {
			for _, c := range batch {
				out.release = append(out.release, c.Seq)
			}
			continue
		}
		failed := r.sendBatch(ctx, batch, &out.telemetry)
		for i, c := range batch {
			err, bad := failed[i]
			if !bad {
				out.done = append(out.done, c.Seq)
				out.answered = true
				continue
			}
			if c.Message.Key != "" {
				if blocked[c.Message.Key] {
					// An earlier message of its key failed in this call (a Sender keeping key
					// order fails the rest of the key unsent): given back, no attempt spent.
					out.release = append(out.release, c.Seq)
					continue
				}
				blocked[c.Message.Key] = true
			}
			if outbox.IsUnavailable(err) {
				// The broker's fault, not the message's: no attempt is spent.
				out.release = append(out.release, c.Seq)
				out.unavailable = err
				continue
			}
			out.answered = true
			if kind, reason, dead := r.giveUp(c, err); dead {
				out.deadLetter(c, kind, reason)
				continue
			}
			delay, ok := outbox.RetryDelay(err)
			if !ok {
				delay = backoff.Delay(c.Attempts, r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff)
			}
			out.retry = append(out.retry, outboxdriver.Retry{Seq: c.Seq, Delay: delay, Error: err.Error()})
			r.obs.retrying(ctx, c, delay, err)
		}
	}
}

// giveUp decides whether a message's own failure err dead-letters it: at once for a
// permanent error, or once it has spent MaxAttempts or MaxRetryTime; and with which kind and
// reason.
func (r *Relay) giveUp(c outboxdriver.Claimed, err error) (kind deadletter.Kind, reason string, dead bool) {
	switch {
	case errors.Is(err, outbox.ErrTooLarge):
		return deadletter.KindTooLarge, err.Error(), true
	case outbox.IsPermanent(err):
		return deadletter.KindPermanent, err.Error(), true
	case c.Attempts >= r.cfg.MaxAttempts:
		return deadletter.KindGaveUp, fmt.Sprintf("gave up after %s: %v", plural(c.Attempts, "attempt"), err), true
	case r.cfg.MaxRetryTime > 0 && !c.FirstFailedAt.IsZero() && time.Since(c.FirstFailedAt) >= r.cfg.MaxRetryTime:
		return deadletter.KindGaveUp, fmt.Sprintf("gave up after %s over %v (MaxRetryTime %v): %v", plural(c.Attempts, "attempt"),
			time.Since(c.FirstFailedAt).Round(time.Second), r.cfg.MaxRetryTime, err), true
	}
	return "", "", false
}

// plural renders n and noun, in the plural unless n is 1: "1 attempt", "3 attempts".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// sendBatch calls the Sender and returns the failed indexes of batch. Its spans and metrics
// may be finished later, by a goroutine of pending. A Send that the broker did not answer
// within SendTimeout fails with an error marked [outbox.Unavailable].
func (r *Relay) sendBatch(ctx context.Context, batch []outboxdriver.Claimed, pending *sync.WaitGroup) map[int]error {
	msgs := make([]outbox.Message, len(batch))
	for i, c := range batch {
		msgs[i] = c.Message
	}
	// The send finishes even if ctx ends mid-way (bounded by SendTimeout): abandoning it
	// would only turn a delivered message into a duplicate later.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.SendTimeout)
	defer cancel()
	sctx, span := r.obs.startSend(sctx, msgs)
	start := time.Now()
	err := r.sender.Send(sctx, msgs)
	var failed map[int]error
	if err != nil {
		var be *outbox.BatchError
		if errors.As(err, &be) {
			failed = be.Failed
			for i, e := range failed {
				if sendTimedOut(sctx, e) {
					failed[i] = r.timedOut(e)
				}
			}
		} else {
			if sendTimedOut(sctx, err) {
				err = r.timedOut(err)
			}
			failed = make(map[int]error, len(batch))
			for i := range batch {
				failed[i] = err
			}
		}
	}
	r.obs.sent(sctx, span, msgs, start, err, failed, pending)
	return failed
}

// ping asks a Sender that is a [outbox.Pinger] whether the broker answers (a probe with nothing to
// send). The broker stays unavailable, to be probed again after the backoff, when the Sender
// cannot tell.
func (r *Relay) ping(ctx context.Context) error {
	p, ok := r.sender.(outbox.Pinger)
	if !ok {
		r.broker.Inconclusive(true)
		return nil
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.SendTimeout)
	defer cancel()
	err := p.Ping(pctx)
	switch {
	case err == nil:
		r.broker.OK(ctx, true)
		return nil
	case sendTimedOut(pctx, err):
		return r.timedOut(err)
	case outbox.IsUnavailable(err):
		return err
	}
	return outbox.Unavailable(err) // a ping concerns no message: any failure is the broker's
}

// timedOut marks the error of a send that outlived SendTimeout as the broker's.
func (r *Relay) timedOut(err error) error {
	return outbox.Unavailable(fmt.Errorf("no answer from the broker within SendTimeout (%v): %w", r.cfg.SendTimeout, err))
}

// splitWaves groups claimed messages (in outbox order) so that each wave holds at most one
// message per key, in key order across waves.
func splitWaves(claimed []outboxdriver.Claimed) [][]outboxdriver.Claimed {
	if !slices.ContainsFunc(claimed, func(c outboxdriver.Claimed) bool { return c.Message.Key != "" }) {
		return [][]outboxdriver.Claimed{claimed} // keyless: one wave, as claimed
	}
	var waves [][]outboxdriver.Claimed
	depth := map[string]int{}
	for _, c := range claimed {
		w := 0
		if k := c.Message.Key; k != "" {
			w = depth[k]
			depth[k] = w + 1
		}
		if w == len(waves) {
			var wave []outboxdriver.Claimed
			if w == 0 { // holds every keyless message: often the whole claim
				wave = make([]outboxdriver.Claimed, 0, len(claimed))
			}
			waves = append(waves, wave)
		}
		waves[w] = append(waves[w], c)
	}
	return waves
}

// sendTimedOut reports whether err is ctx's deadline: a send that the broker did not answer
// within its SendTimeout.
func sendTimedOut(ctx context.Context, err error) bool {
	return errors.Is(err, context.DeadlineExceeded) && errors.Is(ctx.Err(), context.DeadlineExceeded)
}
