// Package consumer runs typed handlers for events received from a broker: decode, dispatch by
// event type, retry through the broker's own redelivery with backoff, and dead-letter what
// cannot be handled — after MaxAttempts, at once for [outbox.Permanent] errors, undecodable
// bodies and unknown event types — so a poison message never blocks the others. It is for
// application developers: the receiving side of a service.
//
// Delivery is at least once. For effects that happen exactly once, wrap handlers with an
// adapter's Idempotent (outboxpgx.Idempotent…): it records the event ID in the inbox table in
// the same transaction as the handler's writes.
//
// # Outages
//
// A failure that is not the message's fault never makes it a dead letter: a handler error that
// [outbox.IsUnavailable] reports (a network error reaching the inbox database, an error the
// adapters mark as the database's, or one a handler marks with [outbox.Unavailable] because its
// own downstream is down), a dead-letter table that cannot be written, a held key that cannot
// be looked up. The delivery is nacked, never acknowledged, to come back after about
// UnavailableBackoff, and the consumer pauses as a whole: it stops receiving and sends one
// message now and then as a probe, the pause doubling (with jitter) up to MaxUnavailableBackoff
// while probes fail the same way. The first delivery that succeeds resumes it. [Consumer.State]
// and OnStateChange say since when it is paused and why; the txoutbox.consumer.messages counter
// counts such deliveries as outcome "unavailable"; the log says so once when it pauses, once a
// minute while it probes, once when it resumes. Idempotent's group commit behaves the same.
//
// The broker keeps counting deliveries meanwhile (SQS ApproximateReceiveCount, Azure
// DequeueCount, JetStream's and RabbitMQ's delivery counts): a message the outage caught
// has a higher Attempt than its own failures. The consumer compares MaxAttempts with the
// count less the deliveries it saw fail for unavailability (remembered per process, for
// the last 65,536 messages), so after the outage a message still gets its MaxAttempts.
// Pausing keeps the count low anyway: only the messages in flight and the probes are
// delivered during an outage. The broker's own limits are the broker's: an SQS redrive
// policy's maxReceiveCount, a JetStream consumer's MaxDeliver, a RabbitMQ quorum queue's
// delivery-limit move or drop a message on their own count, outage or not. Leave them
// unset, or far above MaxAttempts plus the probes of the longest outage you plan for, and
// let the consumer's dead-letter table do that job.
//
// # Unknown event types
//
// Config.UnknownTypes says what becomes of a message whose type has no handler:
// [DeadLetterUnknownTypes] (the default: a type nobody expected is a mistake to look at),
// [AcknowledgeUnknownTypes] (a consumer reading a stream shared with other consumers'
// types) or [RetryUnknownTypes] (a rolling deploy where producers upgrade first: the new
// type waits in the broker until a consumer with its handler takes it). On NATS, a
// consumer can instead receive only its types (outboxnats.Topology.FilterSubjects).
//
// # Keys after a dead letter
//
// On a transport that delivers a key's messages in order (SQS FIFO, a JetStream consumer
// with MaxAckPending 1, Kafka, a single-active-consumer RabbitMQ queue, outboxmemory with
// FIFO), the consumer handles a key's messages one at a time, in order. A dead letter
// acknowledges its message, and by default the key's next message is then handled: the
// key skips past the dead letter, and replaying it later handles it after the events that
// followed it. Where that would be wrong (an account's debits and credits), set
// Config.HoldKeys: each later message of the key goes to the dead-letter table too (kind
// "held", the reason naming the entry that holds the key), until the key has no pending
// dead letter of this consumer. Replay the key's entries — in any order, at any pace;
// `outbox dead-letters replay --all-matching --consumer NAME` replays all the consumer's —
// and it handles them in the key's order, holding any that comes back before the events
// ahead of it (see deadletter.KeyHolds for the exact rule). Discarding the entry that holds
// the key releases it for the events that follow. The cost is one indexed query of the
// dead-letter table per keyed delivery; the relay's dead letters (stage relay) are held by
// the relay itself (relay.Config.KeyPolicy). Unlike the relay, which keeps a held
// key's events in the outbox, the consumer cannot leave them in the broker (they would
// block the key's queue, or the whole consumer, until someone acted), so HoldKeys is not
// the default.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/backoff"
	"github.com/txoutbox/outbox/internal/config"
	"github.com/txoutbox/outbox/internal/telemetry"
)

// Config configures a [Consumer]. Name and DeadLetters are required; other zero fields take
// the defaults below.
type Config struct {
	// Name identifies the consumer: in the inbox table (one inbox per consumer), in dead
	// letters and in logs. Required.
	Name string
	// DeadLetters receives what cannot be handled. Required: nothing is dropped silently.
	DeadLetters deadletter.Writer
	// Concurrency caps how many received messages are unsettled at once: being handled, or
	// waiting behind an earlier delivery of their key (one key is handled sequentially).
	// A slow handler on a busy key can therefore hold several slots. Handlers run on up to
	// Concurrency long-lived goroutines, started as the load needs them. Default 10.
	Concurrency int
	// BatchSize caps one Receive. Default 10.
	BatchSize int
	// MaxAttempts is how many deliveries a message gets before it is dead-lettered.
	// Default 10.
	MaxAttempts int
	// RetryBackoff is the redelivery delay after the first failure, doubling per attempt
	// with jitter up to MaxRetryBackoff. Defaults 1s and 5m. (Brokers cap it: SQS at 12h.)
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// ShutdownTimeout bounds how long Run waits for handlers in flight after its ctx ends;
	// then their contexts are cancelled, and what did not finish is left to redelivery.
	// Default 30s.
	ShutdownTimeout time.Duration
	// AckTimeout bounds each Ack and Nack. Without it a broker that stopped answering (a
	// dropped connection) holds the message's slot, and every later delivery of its key, for
	// as long as the client library waits. A lost ack only means a redelivery, which an
	// idempotent handler absorbs. Default 5s.
	AckTimeout time.Duration
	// Logger receives the consumer's logs, with the event's id, type, key and attempt (never
	// its payload); handler failures to be retried are rate-limited (10 lines per 10s, with
	// the count of those left out). Default slog.Default().
	Logger *slog.Logger
	// TracerProvider and MeterProvider receive the consumer's spans and metrics. Default:
	// the global providers (otel.SetTracerProvider…), which do nothing until the
	// application installs an OpenTelemetry SDK.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// LinkTrace makes each delivery's "process" span the root of a trace of its own, linked
	// to the span that published the event, instead of its child. The default continues the
	// producer's trace: one trace from the request that published an event to its handler.
	// Link when one trace per request would grow too large (a fan-out to many consumers)
	// or when the producer's sampling decision should not apply here.
	LinkTrace bool
	// Middleware wraps every handler, the first outermost: the place for cross-cutting
	// concerns (a tenant in the context, a timeout, extra logging). See [Middleware].
	Middleware []Middleware
	// OnDeadLetter, when set, is called once for each dead letter the consumer writes, after
	// it is stored: to page someone without polling the table. See [deadletter.Notice].
	OnDeadLetter func(ctx context.Context, d deadletter.Notice)

	// UnavailableBackoff is how long the consumer pauses once a delivery fails for reasons
	// of what it depends on rather than of the message: a handler error that
	// [outbox.IsUnavailable] reports (the inbox database down, a network error, an error
	// the handler marked with [outbox.Unavailable]), or a dead-letter table it cannot
	// write. Such a delivery is nacked to come back after about the pause, counts no
	// attempt toward MaxAttempts and is never dead-lettered. While paused the consumer
	// receives nothing but one message per backoff, as a probe; each probe that fails the
	// same way doubles the pause, with jitter, up to MaxUnavailableBackoff, and the first
	// delivery that succeeds resumes receiving. Defaults 100ms and 10s. See [State].
	UnavailableBackoff    time.Duration
	MaxUnavailableBackoff time.Duration
	// OnStateChange, when set, is called each time the consumer pauses for an unavailable
	// dependency or resumes, with the new state (see [Consumer.State]): to page someone. It
	// runs on a handler's goroutine, so it must return quickly.
	OnStateChange func(ctx context.Context, s State)
	// UnknownTypes says what becomes of a message whose event type has no handler here.
	// Default [DeadLetterUnknownTypes]; see [UnknownTypePolicy] for which to pick when.
	UnknownTypes UnknownTypePolicy
	// HoldKeys makes a dead letter of this consumer hold its key, on transports that
	// deliver a key in order: each later delivery of the key goes to the dead-letter table
	// too (kind "held", its reason naming the entry that holds the key) until the key has
	// no pending dead letter of this consumer, so replaying the key's entries restores its
	// order. It costs one indexed query of the dead-letter table per keyed delivery, and
	// needs a table that implements [deadletter.KeyHolds] (every adapter's does). Default
	// false: a dead letter lets the key's next event be handled (the package
	// documentation's "Keys after a dead letter" says what each choice means).
	HoldKeys bool
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
		out.Middleware = slices.Clone(c.Middleware)
	}
	config.Default(&out.Concurrency, 10)
	config.Default(&out.BatchSize, 10)
	config.Default(&out.MaxAttempts, 10)
	config.Default(&out.RetryBackoff, time.Second)
	config.Default(&out.MaxRetryBackoff, 5*time.Minute)
	config.Default(&out.ShutdownTimeout, 30*time.Second)
	config.Default(&out.AckTimeout, 5*time.Second)
	config.Default(&out.UnavailableBackoff, 100*time.Millisecond)
	config.Default(&out.MaxUnavailableBackoff, 10*time.Second)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *Config) validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("Name is required"))
	}
	if c.DeadLetters == nil {
		errs = append(errs, errors.New("DeadLetters is required (outboxpgx.Default.NewDeadLetters(pool)…)"))
	}
	if c.Concurrency < 1 || c.BatchSize < 1 || c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("Concurrency (%d), BatchSize (%d) and MaxAttempts (%d) must be positive", c.Concurrency, c.BatchSize, c.MaxAttempts))
	}
	if c.AckTimeout < 0 || c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("negative AckTimeout (%v) or ShutdownTimeout (%v)", c.AckTimeout, c.ShutdownTimeout))
	}
	if c.RetryBackoff < 0 || c.MaxRetryBackoff < c.RetryBackoff {
		errs = append(errs, fmt.Errorf("backoffs must satisfy 0 <= RetryBackoff (%v) <= MaxRetryBackoff (%v)", c.RetryBackoff, c.MaxRetryBackoff))
	}
	if c.UnavailableBackoff <= 0 || c.MaxUnavailableBackoff < c.UnavailableBackoff {
		errs = append(errs, fmt.Errorf("backoffs must satisfy 0 < UnavailableBackoff (%v) <= MaxUnavailableBackoff (%v)", c.UnavailableBackoff, c.MaxUnavailableBackoff))
	}
	if c.UnknownTypes < DeadLetterUnknownTypes || c.UnknownTypes > RetryUnknownTypes {
		errs = append(errs, fmt.Errorf("UnknownTypes %v is not one of DeadLetterUnknownTypes, AcknowledgeUnknownTypes, RetryUnknownTypes", c.UnknownTypes))
	}
	if c.HoldKeys {
		if _, ok := c.DeadLetters.(deadletter.KeyHolds); c.DeadLetters != nil && !ok {
			errs = append(errs, fmt.Errorf("HoldKeys needs a DeadLetters table that implements deadletter.KeyHolds; %T does not", c.DeadLetters))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("consumer: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}

// Consumer receives messages and runs the handler registered for each event type.
type Consumer struct {
	recv      outbox.Receiver
	cfg       *Config
	handlers  map[string]MessageHandler
	obs       consumerTelemetry
	avail     availability
	running   sync.Mutex
	isRunning atomic.Bool
}

// New returns a consumer reading from r. Register handlers with [Handle] before Run.
func New(r outbox.Receiver, cfg *Config) (*Consumer, error) {
	c := cfg.WithDefaults()
	err := c.validate()
	if r == nil {
		err = errors.Join(err, errors.New("consumer: New needs a Receiver"))
	}
	if err != nil {
		return nil, err
	}
	cons := &Consumer{
		recv:     r,
		cfg:      c,
		handlers: map[string]MessageHandler{},
	}
	cons.obs.init(cons.cfg, r)
	cons.avail.init(cons)
	return cons, nil
}

// Handler handles one event. Return nil when done (the message is acknowledged), an error
// to retry it later, [outbox.Permanent] to dead-letter it now, or [outbox.RetryAfter] to
// choose the delay.
type Handler[T outbox.Payload] func(ctx context.Context, e outbox.Event[T]) error

// Handle registers h for events of type T (by T's EventType; T may be a pointer to a type
// with a value-receiver EventType). Registering a type twice, or a T whose EventType panics,
// panics: it is a programming error, like a duplicate HTTP route.
func Handle[T outbox.Payload](c *Consumer, h Handler[T]) {
	typ, err := outbox.EventTypeOf[T]()
	if err != nil {
		panic(fmt.Sprintf("consumer: cannot register a handler: %v", err))
	}
	if _, dup := c.handlers[typ]; dup {
		panic(fmt.Sprintf("consumer: a handler for %q is already registered", typ))
	}
	var mh MessageHandler = func(ctx context.Context, m outbox.Message) error {
		e, err := outbox.Decode[T](m)
		if err != nil {
			return outbox.Permanent(&undecodable{err})
		}
		return h(ctx, e)
	}
	for i := len(c.cfg.Middleware) - 1; i >= 0; i-- {
		mh = c.cfg.Middleware[i](mh)
	}
	c.handlers[typ] = mh
}

// MessageHandler handles one message of a registered event type, before it is decoded: the
// form that [Middleware] wraps. Its error means what a [Handler]'s does.
type MessageHandler func(ctx context.Context, m outbox.Message) error

// Middleware wraps a handler with behaviour of its own, like net/http middleware: it calls
// next to run the handler (or does not, to skip it) and may change the context and the
// error. The consumer's process span is already in ctx, and a panic is recovered as a
// permanent error wherever it happens. For example, a deadline per handler:
//
//	func Timeout(d time.Duration) consumer.Middleware {
//		return func(next consumer.MessageHandler) consumer.MessageHandler {
//			return func(ctx context.Context, m outbox.Message) error {
//				ctx, cancel := context.WithTimeout(ctx, d)
//				defer cancel()
//				return next(ctx, m)
//			}
//		}
//	}
type Middleware func(next MessageHandler) MessageHandler

// undecodable marks the error of a body that does not decode into the handler's type.
type undecodable struct{ err error }

func (u *undecodable) Error() string { return u.err.Error() }
func (u *undecodable) Unwrap() error { return u.err }

// DeadLetterKind implements deadletter.Classified: such a delivery is dead-lettered as
// undecodable.
func (u *undecodable) DeadLetterKind() deadletter.Kind { return deadletter.KindUndecodable }

// Info describes the delivery a handler is running for.
type Info struct {
	// Consumer is the consumer's Config.Name, the inbox's key prefix.
	Consumer string
	// Attempt counts the deliveries of the message, this one included (1 the first time).
	Attempt int
}

type infoKey struct{}

// running is what Run puts in a handler's context: the delivery's Info, and whether the
// handler reported it as a duplicate.
type running struct {
	info      Info
	duplicate atomic.Bool
}

// InfoFrom returns the delivery info that Run puts in handler contexts; idempotency
// wrappers read the consumer's name from it.
func InfoFrom(ctx context.Context) (Info, bool) {
	r, ok := ctx.Value(infoKey{}).(*running)
	if !ok {
		return Info{}, false
	}
	return r.info, true
}

// WithInfo returns ctx carrying i, for calling handlers outside Run (tests).
func WithInfo(ctx context.Context, i Info) context.Context {
	return context.WithValue(ctx, infoKey{}, &running{info: i})
}

// MarkDuplicate tells the consumer running ctx's handler that the event was handled before
// (an inbox hit): the delivery is counted as a duplicate instead of handled. The
// idempotency package's wrappers call it; a handler that detects duplicates itself may too.
// Outside a consumer's handler it does nothing.
func MarkDuplicate(ctx context.Context) {
	if r, ok := ctx.Value(infoKey{}).(*running); ok {
		r.duplicate.Store(true)
	}
}

// Run receives and handles messages until ctx ends, then waits for handlers in flight (up to
// ShutdownTimeout) and returns nil. A message is acknowledged only after its handler
// returned nil, or after it was written to the dead-letter table. Run returns an error if
// the consumer has no handlers or is already running.
func (c *Consumer) Run(ctx context.Context) error {
	if len(c.handlers) == 0 {
		return errors.New("consumer: Run with no handlers registered")
	}
	if !c.running.TryLock() {
		return errors.New("consumer: Run called while running")
	}
	defer c.running.Unlock()
	c.isRunning.Store(true)
	defer c.isRunning.Store(false)

	// Handlers outlive ctx by up to ShutdownTimeout, so in-flight work can finish.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()

	slots := make(chan struct{}, c.cfg.Concurrency)
	p := &pool{c: c, ctx: work, slots: slots, jobs: make(chan job), keyed: map[string][]received{}}
	defer p.close()
	failures := 0
	for ctx.Err() == nil {
		// While a dependency is unavailable, receive only a probe now and then.
		probe, ok := c.avail.Wait(ctx)
		if !ok {
			continue
		}
		// Wait for a free slot, then receive no more than the free slots.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			if probe {
				c.avail.Inconclusive(true)
			}
			continue
		}
		free := 1
		for !probe && free < c.cfg.BatchSize {
			select {
			case slots <- struct{}{}:
				free++
				continue
			default:
			}
			break
		}
		ds, err := c.recv.Receive(ctx, free)
		for range free - len(ds) {
			<-slots
		}
		if probe && (err != nil || len(ds) == 0) {
			c.avail.Inconclusive(true) // nothing to probe with: try again after the backoff
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			wait := backoff.Delay(failures, 100*time.Millisecond, 10*time.Second)
			c.obs.log.ErrorContext(ctx, "consumer: receive failed", "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		failures = 0
		for _, d := range ds {
			p.dispatch(d, probe)
		}
	}
	return nil
}

// received is a delivery with its message, read once.
type received struct {
	d     outbox.Delivery
	m     outbox.Message
	err   error // from d.Message: the delivery is malformed
	probe bool  // received as the probe of a paused consumer
}

// job is work for one of the pool's workers: a delivery without a key, or a key whose
// queue (pool.keyed) to work through.
type job struct {
	r   received
	key string
}

// pool runs the handlers of one Run on up to Concurrency long-lived workers, started as
// the load needs them. A goroutine per delivery would start on a small stack and grow it
// by copying on every delivery (a database call goes deep); a worker grows it once.
// Every job holds at least one of the Concurrency slots until its last delivery is
// settled, so Concurrency workers are always enough: a job waits for a worker only while
// one is finishing the job before.
type pool struct {
	c       *Consumer
	ctx     context.Context // the handlers' context: outlives Run's by up to ShutdownTimeout
	slots   chan struct{}   // one per unsettled delivery, taken by Run before it receives
	jobs    chan job        // unbuffered: a send succeeds when a worker is idle
	workers int             // started so far; only Run's goroutine reads or writes it
	wg      sync.WaitGroup

	mu    sync.Mutex
	keyed map[string][]received // per-key queues of deliveries waiting their turn
}

// dispatch has d handled by a worker, after any earlier delivery of its key.
func (p *pool) dispatch(d outbox.Delivery, probe bool) {
	r := received{d: d, probe: probe}
	r.m, r.err = d.Message()
	if r.err != nil || r.m.Key == "" {
		p.submit(job{r: r})
		return
	}
	p.mu.Lock()
	queue, busy := p.keyed[r.m.Key]
	p.keyed[r.m.Key] = append(queue, r)
	p.mu.Unlock()
	if !busy { // otherwise the worker on the key gets to it, in order
		p.submit(job{key: r.m.Key})
	}
}

// submit hands j to an idle worker, or to a new one while there are fewer than
// Concurrency; else it waits for a worker to finish its job.
func (p *pool) submit(j job) {
	select {
	case p.jobs <- j:
		return
	default:
	}
	if p.workers < p.c.cfg.Concurrency {
		p.workers++
		p.wg.Go(func() { p.work(j) })
		return
	}
	p.jobs <- j
}

// work runs j, then the jobs it is given until the pool closes.
func (p *pool) work(j job) {
	for ok := true; ok; j, ok = <-p.jobs {
		if j.key == "" {
			p.c.handle(p.ctx, j.r)
			<-p.slots
			continue
		}
		for {
			p.mu.Lock()
			q := p.keyed[j.key]
			if len(q) == 0 {
				delete(p.keyed, j.key)
				p.mu.Unlock()
				break
			}
			next := q[0]
			q[0] = received{} // let the settled delivery be collected
			p.keyed[j.key] = q[1:]
			p.mu.Unlock()
			p.c.handle(p.ctx, next)
			<-p.slots
		}
	}
}

// close stops the workers once their jobs are done and waits for them.
func (p *pool) close() {
	close(p.jobs)
	p.wg.Wait()
}

// handle runs one delivery to its end: ack, nack with a delay, or dead letter and ack.
func (c *Consumer) handle(ctx context.Context, r received) {
	start := time.Now()
	d, m := r.d, r.m
	attempt := d.Attempt()
	dest := c.obs.destination(d, m)
	if r.err != nil {
		c.deadLetter(ctx, r, malformed(m, r.err), attempt, dest)
		return
	}
	ctx, span := c.obs.startProcess(ctx, m, dest, attempt)
	defer span.End()
	h, ok := c.handlers[m.Type]
	if !ok {
		c.unknownType(ctx, r, attempt, dest)
		return
	}
	if c.cfg.HoldKeys && m.Key != "" && c.holdKey(ctx, r, attempt, dest) {
		return
	}
	run := &running{info: Info{Consumer: c.cfg.Name, Attempt: attempt}}
	err := callHandler(context.WithValue(ctx, infoKey{}, run), h, m)
	c.obs.processed(ctx, span, m, dest, start, err)
	if err == nil {
		outcome := telemetry.Handled
		if run.duplicate.Load() {
			outcome = telemetry.Duplicate
		}
		c.obs.settled(ctx, m, dest, outcome)
		c.avail.ok(ctx, m.ID, r.probe)
		if err := c.ack(ctx, d); err != nil {
			// Redelivery follows; an idempotent handler absorbs it.
			c.obs.logFailure(ctx, "consumer: ack failed", m, attempt, err)
		}
		return
	}
	switch {
	case ctx.Err() != nil:
		// Shutting down: leave the message to its visibility timeout, unacknowledged.
		c.avail.Inconclusive(r.probe)
		c.obs.log.LogAttrs(ctx, slog.LevelInfo, "consumer: handler interrupted by shutdown", eventAttrs(m, attempt)...)
	case outbox.IsUnavailable(err):
		// Not the message's fault: whatever its attempt count, it waits for the outage
		// to end, and the consumer pauses.
		c.unavailable(ctx, r, dest, err)
	case outbox.IsPermanent(err):
		kind := deadletter.KindPermanent
		if classified, ok := errors.AsType[deadletter.Classified](err); ok { // undecodable, a missing blob…
			kind = classified.DeadLetterKind()
		}
		c.deadLetter(ctx, r, deadletter.Entry{Message: m, Kind: kind, Reason: err.Error()}, attempt, dest)
	case c.avail.discount(m.ID, attempt) >= c.cfg.MaxAttempts:
		c.deadLetter(ctx, r, deadletter.Entry{Message: m, Kind: deadletter.KindGaveUp,
			Reason: fmt.Sprintf("gave up after %d attempts: %v", attempt, err)}, attempt, dest)
	default:
		c.avail.Inconclusive(r.probe)
		delay, ok := outbox.RetryDelay(err)
		if !ok {
			delay = backoff.Delay(attempt, c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff)
		}
		c.obs.settled(ctx, m, dest, telemetry.Failed)
		c.obs.retrying(ctx, m, attempt, delay, err)
		if err := c.nack(ctx, d, delay); err != nil {
			c.obs.logFailure(ctx, "consumer: nack failed; the message reappears after its visibility timeout", m, attempt, err)
		}
	}
}

// unavailable settles r, which failed with err for reasons of what the consumer depends
// on: it pauses the consumer and nacks r to come back about when the next probe goes,
// never acknowledging it.
func (c *Consumer) unavailable(ctx context.Context, r received, dest string, err error) {
	c.avail.failed(ctx, r.m.ID, r.probe, err)
	delay, ok := outbox.RetryDelay(err)
	if !ok {
		delay = c.avail.Delay()
	}
	c.obs.settled(ctx, r.m, dest, telemetry.Unavailable)
	if err := c.nack(ctx, r.d, delay); err != nil {
		c.obs.logFailure(ctx, "consumer: nack failed; the message reappears after its visibility timeout", r.m, r.d.Attempt(), err)
	}
}

// callHandler runs h, turning a panic into a permanent error so one bad event cannot crash
// the consumer.
func callHandler(ctx context.Context, h MessageHandler, m outbox.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = outbox.Permanent(fmt.Errorf("handler panicked: %v", p))
		}
	}()
	return h(ctx, m)
}

// malformed is the dead letter of a delivery whose Message failed with err: everything a
// transport's [outbox.MalformedError] kept (what could be read, the broker's message ID,
// the attributes and body as received), so acknowledging the message loses nothing.
func malformed(partial outbox.Message, err error) deadletter.Entry {
	e := deadletter.Entry{Message: partial, Kind: deadletter.KindMalformed, Reason: err.Error()}
	if !errors.Is(err, outbox.ErrMalformed) {
		e.Reason = fmt.Sprintf("%v: %v", outbox.ErrMalformed, err)
	}
	var me *outbox.MalformedError
	if errors.As(err, &me) {
		e.Message, e.BrokerMessageID = me.Partial, me.BrokerMessageID
		e.Raw = &deadletter.Raw{Attributes: maps.Clone(me.Attributes), Body: me.Body}
	}
	return e
}

// deadLetter records e (the entry of r, Stage, Consumer, Attempts and times filled in
// here) and acknowledges r. The table stores any content (see the deadletter package), so a
// failure means it is unreachable: that is no fault of the message, which is nacked, never
// acknowledged, and the consumer pauses as for any unavailable dependency.
func (c *Consumer) deadLetter(ctx context.Context, r received, e deadletter.Entry, attempt int, dest string) {
	now := time.Now().UTC()
	e.Stage, e.Consumer, e.Attempts, e.FirstFailedAt, e.LastFailedAt = deadletter.StageConsumer, c.cfg.Name, attempt, now, now
	err := c.cfg.DeadLetters.Add(ctx, e)
	m := e.Message
	if err != nil {
		c.obs.logFailure(ctx, "consumer: writing a dead letter failed; the message will be retried", m, attempt,
			fmt.Errorf("kind %s, reason %q: %w", e.Kind, e.Reason, err))
		c.unavailable(ctx, r, dest, fmt.Errorf("consumer: writing a dead letter: %w", err))
		return
	}
	attrs := append(eventAttrs(m, attempt), slog.String("kind", string(e.Kind)), slog.String("reason", e.Reason))
	if e.BrokerMessageID != "" {
		attrs = append(attrs, slog.String("broker_message_id", e.BrokerMessageID))
	}
	c.obs.log.LogAttrs(ctx, slog.LevelError, "consumer: message dead-lettered", attrs...)
	c.obs.deadLettered(ctx, e, dest)
	c.avail.ok(ctx, m.ID, r.probe)
	if err := c.ack(ctx, r.d); err != nil {
		c.obs.logFailure(ctx, "consumer: ack of a dead-lettered message failed", m, attempt, err)
	}
}

// eventAttrs are the log attributes of a delivery: the event's identity, never its payload.
func eventAttrs(m outbox.Message, attempt int) []slog.Attr {
	return []slog.Attr{slog.String("event_id", m.ID.String()), slog.String("type", m.Type),
		slog.String("key", m.Key), slog.Int("attempt", attempt)}
}

// ack and nack settle d within AckTimeout.
func (c *Consumer) ack(ctx context.Context, d outbox.Delivery) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
	defer cancel()
	return d.Ack(ctx)
}

func (c *Consumer) nack(ctx context.Context, d outbox.Delivery, delay time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
	defer cancel()
	return d.Nack(ctx, delay)
}
