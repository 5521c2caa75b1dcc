// Package telemetry is what the relay and the consumer share to trace, measure and log:
// the OpenTelemetry scope, the propagator of the CloudEvents distributed-tracing extension,
// the instruments (semantic-convention names where they exist, txoutbox.* where not), a
// cache of attribute sets so a busy pipeline does not allocate per event, and a rate limit
// for logs that a failure storm would otherwise repeat per event.
//
// Everything here uses the OpenTelemetry API only: with no SDK installed, instruments report
// Enabled false and spans do not record, and callers skip the work.
package telemetry

import (
	"context"
	"errors"
	"iter"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope of every tracer and meter of txoutbox.
const Scope = "github.com/txoutbox/outbox"

// Propagator reads and writes the trace context in an event's headers. It always uses W3C
// Trace Context (traceparent, tracestate: the CloudEvents distributed-tracing extension),
// whatever the application installed, then the global propagator (baggage, or another
// format the application asked for).
var Propagator propagation.TextMapPropagator = propagator{}

// propagator is traceContext, then the global propagator, as a composite of the two would
// be, with less work per event: it extracts traceparent once (the global propagator is not
// shown the headers traceContext read: an application that installed TraceContext would
// parse them a second time, on the general path), and it skips the global propagator while
// the application has installed none (it takes a lock to find it has nothing to do).
type propagator struct{}

func (propagator) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	traceContext{}.Inject(ctx, c)
	if g := globalPropagator(); g != nil {
		g.Inject(ctx, c)
	}
}

func (propagator) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	ctx = traceContext{}.Extract(ctx, c)
	if g := globalPropagator(); g != nil {
		if m, ok := c.(propagation.MapCarrier); ok {
			ctx = g.Extract(ctx, withoutTraceContextMap(m))
		} else {
			ctx = g.Extract(ctx, withoutTraceContext{c})
		}
	}
	return ctx
}

func (propagator) Fields() []string {
	fields := traceContext{}.Fields()
	if g := globalPropagator(); g != nil {
		for _, f := range g.Fields() {
			if !slices.Contains(fields, f) {
				fields = append(fields, f)
			}
		}
	}
	return fields
}

// uninstalled is the global propagator before the application installs one: it delegates
// to what the application installs later, and until then does nothing. otel hands out the
// installed one itself from then on. Comparable and fieldless, or it is not that one (an
// application that installed a propagator before this package was initialized).
var (
	uninstalled     = otel.GetTextMapPropagator()
	skipUninstalled = reflect.TypeOf(uninstalled).Comparable() && len(uninstalled.Fields()) == 0
)

// globalPropagator is the application's propagator, nil while it installed none.
func globalPropagator() propagation.TextMapPropagator {
	g := otel.GetTextMapPropagator()
	if skipUninstalled && g == uninstalled {
		return nil
	}
	return g
}

// withoutTraceContext and withoutTraceContextMap are carriers without traceparent and
// tracestate, for the global propagator once traceContext read them. The map's is the
// common case, and it is pointer-shaped: passing it allocates nothing.
type (
	withoutTraceContext    struct{ c propagation.TextMapCarrier }
	withoutTraceContextMap propagation.MapCarrier
)

func (w withoutTraceContext) Get(key string) string {
	if isTraceContext(key) {
		return ""
	}
	return w.c.Get(key)
}
func (w withoutTraceContext) Set(key, value string) { w.c.Set(key, value) }
func (w withoutTraceContext) Keys() []string {
	return slices.DeleteFunc(slices.Clone(w.c.Keys()), isTraceContext) // the carrier's may be its own
}

func (w withoutTraceContextMap) Get(key string) string {
	if isTraceContext(key) {
		return ""
	}
	return w[key]
}
func (w withoutTraceContextMap) Set(key, value string) { w[key] = value }
func (w withoutTraceContextMap) Keys() []string {
	return slices.DeleteFunc(propagation.MapCarrier(w).Keys(), isTraceContext)
}

func isTraceContext(key string) bool { return key == "traceparent" || key == "tracestate" }

// traceContext is propagation.TraceContext with a faster Extract for the common
// traceparent (version 00): every delivery extracts one, and the consumer's hot path should
// not pay for the general parser's allocations.
type traceContext struct{ propagation.TraceContext }

func (tc traceContext) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	tp := c.Get("traceparent")
	if tp == "" {
		return ctx
	}
	sc, ok := fastTraceparent(tp)
	if !ok {
		return tc.TraceContext.Extract(ctx, c)
	}
	if ts := c.Get("tracestate"); ts != "" {
		state, err := trace.ParseTraceState(ts)
		if err == nil {
			sc = sc.WithTraceState(state)
		}
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Tracer returns the txoutbox tracer of tp, or of the global provider when tp is nil.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(Scope)
}

// Meter returns the txoutbox meter of mp, or of the global provider when mp is nil.
func Meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(Scope)
}

// Attribute keys of txoutbox's own metrics and spans.
const (
	// OutcomeKey is how the consumer settled a delivery: "handled", "duplicate", "failed"
	// (nacked for a retry), "dead_lettered", "unavailable" (nacked while a dependency is
	// down, no attempt counted), "ignored" (an unknown type acknowledged) or "no_handler"
	// (an unknown type nacked until a handler exists).
	OutcomeKey = attribute.Key("txoutbox.outcome")
	// StageKey is where a dead letter came from: "relay" or "consumer".
	StageKey = attribute.Key("txoutbox.stage")
	// KindKey is a dead letter's kind (deadletter.Kind).
	KindKey = attribute.Key("txoutbox.dead_letter.kind")
	// OutboxKey names the outbox table of a gauge; in a relay.Group, the outbox's name there,
	// on every metric and span of its relay.
	OutboxKey = attribute.Key("txoutbox.outbox")
	// RelayKey names the relay of a span.
	RelayKey = attribute.Key("txoutbox.relay")
	// ComponentKey says what is unavailable: "broker" or "database".
	ComponentKey = attribute.Key("txoutbox.component")
	// OtherType stands for an event type that no handler is registered for, so a stream of
	// foreign or malformed messages cannot grow the metrics' cardinality without bound.
	OtherType = "_OTHER"
)

// Outcomes of a consumer delivery.
const (
	Handled      = "handled"
	Duplicate    = "duplicate"
	Failed       = "failed"
	DeadLettered = "dead_lettered"
	Unavailable  = "unavailable"
	Ignored      = "ignored"
	NoHandler    = "no_handler"
)

// durationBuckets are the semantic conventions' advice for messaging durations, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// latencyBuckets reach further: an event may wait for a retry or a relay outage.
var latencyBuckets = []float64{0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// Instruments are the metrics of the relay and the consumer (docs/observability.md lists them).
type Instruments struct {
	// Relay.
	Sent         messagingconv.ClientSentMessages      // per message sent or failed (error.type)
	SendDuration messagingconv.ClientOperationDuration // per Send call
	BatchSize    metric.Int64Histogram                 // txoutbox.relay.batch.size, per claim
	Latency      metric.Float64Histogram               // txoutbox.relay.latency, created → sent
	// Consumer.
	ProcessDuration messagingconv.ProcessDuration // per handler run
	Consumed        metric.Int64Counter           // txoutbox.consumer.messages, per settled delivery
	// Both stages.
	DeadLetters metric.Int64Counter // txoutbox.dead_letters.added
	// Gauges (the relay registers their callback while it runs).
	Backlog            metric.Int64ObservableGauge
	BacklogAge         metric.Float64ObservableGauge
	DeadLettersPending metric.Int64ObservableGauge
	DeadLetterAge      metric.Float64ObservableGauge
	HeldKeys           metric.Int64ObservableGauge
	// SlotRetainedWAL and SlotLag are the bytes of WAL the replication slot of a store that
	// reads the log keeps, and how far its confirmed position is behind (outboxdriver.SlotStats).
	SlotRetainedWAL, SlotLag metric.Int64ObservableGauge
	// Unavailable is how long the relay's broker or database (ComponentKey) has been
	// unavailable, 0 while it is available.
	Unavailable metric.Float64ObservableGauge
}

// NewInstruments creates the instruments on m. An error names an instrument the SDK refused;
// the others still work.
func NewInstruments(m metric.Meter) (*Instruments, error) {
	var errs []error
	i := &Instruments{}
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	i.Sent, err = messagingconv.NewClientSentMessages(m)
	keep(err)
	i.SendDuration, err = messagingconv.NewClientOperationDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	keep(err)
	i.BatchSize, err = m.Int64Histogram("txoutbox.relay.batch.size", metric.WithUnit("{message}"),
		metric.WithDescription("Messages leased by one claim of the relay."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000))
	keep(err)
	i.Latency, err = m.Float64Histogram("txoutbox.relay.latency", metric.WithUnit("s"),
		metric.WithDescription("Time from an event's creation (in the transaction that published it) to the broker's acceptance of it."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	keep(err)
	i.ProcessDuration, err = messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	keep(err)
	i.Consumed, err = m.Int64Counter("txoutbox.consumer.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries settled by a consumer, by outcome: handled, duplicate (an inbox hit), failed (to be retried), dead_lettered, unavailable (retried while a dependency is down), ignored (an unknown type acknowledged), no_handler (an unknown type retried)."))
	keep(err)
	i.DeadLetters, err = m.Int64Counter("txoutbox.dead_letters.added", metric.WithUnit("{message}"),
		metric.WithDescription("Messages written to the dead-letter table, by stage and kind."))
	keep(err)
	i.Backlog, err = m.Int64ObservableGauge("txoutbox.outbox.backlog", metric.WithUnit("{message}"),
		metric.WithDescription("Messages in the outbox not yet delivered."))
	keep(err)
	i.BacklogAge, err = m.Float64ObservableGauge("txoutbox.outbox.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest undelivered message in the outbox (0 when empty)."))
	keep(err)
	i.DeadLettersPending, err = m.Int64ObservableGauge("txoutbox.dead_letters.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters neither replayed nor discarded."))
	keep(err)
	i.DeadLetterAge, err = m.Float64ObservableGauge("txoutbox.dead_letters.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Time since the oldest pending dead letter failed (0 when none)."))
	keep(err)
	i.HeldKeys, err = m.Int64ObservableGauge("txoutbox.outbox.held_keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys whose later events wait behind a pending dead letter of the relay (replay or discard it to release the key)."))
	keep(err)
	i.SlotRetainedWAL, err = m.Int64ObservableGauge("txoutbox.relay.slot.retained_wal", metric.WithUnit("By"),
		metric.WithDescription("WAL the replication slot of a relay that reads the log keeps on the server's disk (only such relays report it)."))
	keep(err)
	i.SlotLag, err = m.Int64ObservableGauge("txoutbox.relay.slot.lag", metric.WithUnit("By"),
		metric.WithDescription("How far the replication slot's confirmed position is behind the server's WAL (only relays that read the log report it)."))
	keep(err)
	i.Unavailable, err = m.Float64ObservableGauge("txoutbox.relay.unavailable", metric.WithUnit("s"),
		metric.WithDescription("How long the relay's broker or database (txoutbox.component) has been unavailable; 0 while available."))
	keep(err)
	return i, errors.Join(errs...)
}

// Key is up to four attribute values, the key of a cached attribute set.
type Key struct{ A, B, C, D string }

// Sets caches the measurement options of attribute sets, so that recording a measurement
// allocates nothing once its set was seen. Lookups take no lock and write nothing shared
// (every event of a busy pipeline makes one or two, from several goroutines): the map is
// replaced, not changed, when a set is added. Past maxSets distinct sets it builds them per
// call instead of growing.
type Sets struct {
	build func(Key) []attribute.KeyValue
	mu    sync.Mutex // serializes additions
	m     atomic.Pointer[map[Key]*setOptions]
}

type setOptions struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

const maxSets = 4096

// NewSets returns a cache whose sets are built by build (a function of the key alone).
func NewSets(build func(Key) []attribute.KeyValue) *Sets {
	s := &Sets{build: build}
	s.m.Store(&map[Key]*setOptions{})
	return s
}

func (s *Sets) get(k Key) *setOptions {
	if o, ok := (*s.m.Load())[k]; ok {
		return o
	}
	opt := metric.WithAttributeSet(attribute.NewSet(s.build(k)...))
	o := &setOptions{add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.m.Load()
	if prev, ok := old[k]; ok {
		return prev
	}
	if len(old) < maxSets {
		m := make(map[Key]*setOptions, len(old)+1)
		maps.Copy(m, old)
		m[k] = o
		s.m.Store(&m)
	}
	return o
}

// Add adds n to c with k's attributes.
func (s *Sets) Add(ctx context.Context, c metric.Int64Counter, n int64, k Key) {
	c.Add(ctx, n, s.get(k).add...)
}

// RecordOptions returns the options that record with k's attributes, for a caller recording
// many values of one set.
func (s *Sets) RecordOptions(k Key) []metric.RecordOption { return s.get(k).rec }

// Record records v in h with k's attributes.
func (s *Sets) Record(ctx context.Context, h metric.Float64Histogram, v float64, k Key) {
	h.Record(ctx, v, s.get(k).rec...)
}

// ErrorType is the error.type attribute value of err ("" for nil): the semantic
// conventions' low-cardinality class of an error (its Go type).
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	return semconv.ErrorType(err).Value.AsString()
}

// MaxLinks is how many links one span carries: the SDK's default span limit. The relay's
// send of a larger batch spreads its links over child spans of this many each, so none is
// dropped.
const MaxLinks = 128

// EachLink calls add with each distinct valid span context stored in headers (by
// Propagator), in order. A batch's events often share their publisher: each distinct
// traceparent is parsed once. It allocates nothing in the steady state: the relay reads
// hundreds of headers per batch, and hands each link to the span straight away.
func EachLink(headers iter.Seq[map[string]string], add func(trace.Link)) {
	seen := seenPool.Get().(map[string]struct{})
	defer func() {
		clear(seen)
		seenPool.Put(seen)
	}()
	for h := range headers {
		tp, ok := h["traceparent"]
		if !ok {
			continue
		}
		if _, dup := seen[tp]; dup {
			continue
		}
		seen[tp] = struct{}{}
		if sc := parseTraceparent(tp, h); sc.IsValid() {
			add(trace.Link{SpanContext: sc})
		}
	}
}

// seenPool holds EachLink's sets of the traceparents seen, emptied.
var seenPool = sync.Pool{New: func() any { return map[string]struct{}{} }}

// parseTraceparent reads a traceparent without the propagator's context machinery (the
// relay reads hundreds per batch); forms other than version 00 go through Propagator.
func parseTraceparent(tp string, h map[string]string) trace.SpanContext {
	if sc, ok := fastTraceparent(tp); ok {
		return sc
	}
	return trace.SpanContextFromContext(Propagator.Extract(context.Background(), propagation.MapCarrier(h)))
}

// fastTraceparent reads a valid version 00 traceparent; ok is false for anything else,
// which the general parser then judges.
func fastTraceparent(tp string) (trace.SpanContext, bool) {
	if len(tp) != 55 || tp[:3] != "00-" || tp[35] != '-' || tp[52] != '-' {
		return trace.SpanContext{}, false
	}
	tid, err1 := trace.TraceIDFromHex(tp[3:35])
	sid, err2 := trace.SpanIDFromHex(tp[36:52])
	flags, ok := hexByte(tp[53:55])
	if err1 != nil || err2 != nil || !ok {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
		TraceFlags: trace.TraceFlags(flags) & trace.FlagsSampled, Remote: true})
	return sc, sc.IsValid()
}

func hexByte(s string) (byte, bool) {
	var b byte
	for _, c := range []byte(s) {
		switch {
		case c >= '0' && c <= '9':
			b = b<<4 | (c - '0')
		case c >= 'a' && c <= 'f':
			b = b<<4 | (c - 'a' + 10)
		default:
			return 0, false
		}
	}
	return b, true
}

// LogLimiter lets through at most Burst log lines per Window and counts the rest, so a
// failure storm (a broker outage failing every message) logs a handful of lines with the
// count of those left out instead of one per event. The zero value allows 10 per 10s.
type LogLimiter struct {
	Burst  int
	Window time.Duration

	mu         sync.Mutex
	start      time.Time
	n          int
	suppressed int
	now        func() time.Time // tests set it; time.Now otherwise
}

// Allow reports whether a line may be logged now, and how many lines were suppressed since
// the last one allowed (to log with it).
func (l *LogLimiter) Allow() (ok bool, suppressed int) {
	burst, window := l.Burst, l.Window
	if burst <= 0 {
		burst = 10
	}
	if window <= 0 {
		window = 10 * time.Second
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if now.Sub(l.start) >= window {
		l.start, l.n = now, 0
	}
	if l.n >= burst {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
