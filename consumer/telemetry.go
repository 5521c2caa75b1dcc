package consumer

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/telemetry"
)

// consumerTelemetry is the consumer's tracing, metrics, logs and OnDeadLetter hook. With no
// SDK installed a delivery costs the extraction of its trace context (so the handler's own
// outgoing calls still carry the trace) and a few branches.
type consumerTelemetry struct {
	cfg      *Config
	tracer   trace.Tracer
	inst     *telemetry.Instruments
	describe outbox.Describer // the Receiver's, or nil
	system   string
	log      *slog.Logger
	failLog  telemetry.LogLimiter

	durationSets, settledSets, deadSets *telemetry.Sets
	lastName                            atomic.Pointer[spanName]
}

func (t *consumerTelemetry) init(cfg *Config, r outbox.Receiver) {
	t.cfg = cfg
	t.tracer = telemetry.Tracer(cfg.TracerProvider)
	t.log = cfg.Logger.With("consumer", cfg.Name)
	inst, err := telemetry.NewInstruments(telemetry.Meter(cfg.MeterProvider))
	if err != nil {
		t.log.Warn("consumer: some metrics are unavailable", "err", err)
	}
	t.inst = inst
	if d, ok := r.(outbox.Describer); ok {
		t.describe, t.system = d, d.MessagingSystem()
	}
	base := func(k telemetry.Key) []attribute.KeyValue {
		kv := make([]attribute.KeyValue, 0, 7)
		kv = append(kv, semconv.MessagingConsumerGroupName(cfg.Name), semconv.CloudEventsEventType(k.A))
		if t.system != "" {
			kv = append(kv, semconv.MessagingSystemKey.String(t.system))
		}
		if k.B != "" {
			kv = append(kv, semconv.MessagingDestinationName(k.B))
		}
		return kv
	}
	t.durationSets = telemetry.NewSets(func(k telemetry.Key) []attribute.KeyValue {
		kv := append(base(k), semconv.MessagingOperationName("process"))
		if k.C != "" {
			kv = append(kv, semconv.ErrorTypeKey.String(k.C))
		}
		return kv
	})
	t.settledSets = telemetry.NewSets(func(k telemetry.Key) []attribute.KeyValue {
		return append(base(k), telemetry.OutcomeKey.String(k.D))
	})
	t.deadSets = telemetry.NewSets(func(k telemetry.Key) []attribute.KeyValue {
		return append(base(k), telemetry.StageKey.String("consumer"), telemetry.KindKey.String(k.D))
	})
}

// destination is where d came from: by the Delivery's own account, else the Receiver's.
func (t *consumerTelemetry) destination(d outbox.Delivery, m outbox.Message) string {
	if dd, ok := d.(outbox.Describer); ok {
		return dd.DestinationName(m)
	}
	if t.describe != nil {
		return t.describe.DestinationName(m)
	}
	return ""
}

var processKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// spanName is a process span's name and the destination it names.
type spanName struct{ dest, name string }

// processName is "process <dest>", kept from the last delivery: a consumer mostly receives
// from one destination, and the name is then not built again per delivery.
func (t *consumerTelemetry) processName(dest string) string {
	if n := t.lastName.Load(); n != nil && n.dest == dest {
		return n.name
	}
	n := &spanName{dest: dest, name: "process " + dest}
	t.lastName.Store(n)
	return n.name
}

// startProcess continues the trace stored in m's headers (or links to it, with LinkTrace)
// with the consumer span "process <destination>".
func (t *consumerTelemetry) startProcess(ctx context.Context, m outbox.Message, dest string, attempt int) (context.Context, trace.Span) {
	pctx := telemetry.Propagator.Extract(ctx, propagation.MapCarrier(m.Headers))
	opts := processKind
	if !t.cfg.LinkTrace {
		ctx = pctx
	} else if sc := trace.SpanContextFromContext(pctx); sc.IsValid() {
		opts = []trace.SpanStartOption{processKind[0], trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: sc})}
	}
	name := "process"
	if dest != "" {
		name = t.processName(dest) // named at the start: a rename takes the span's lock
	}
	ctx, span := t.tracer.Start(ctx, name, opts...)
	if !span.IsRecording() {
		return ctx, span
	}
	buf := processAttrsPool.Get().(*[maxProcessAttrs]attribute.KeyValue)
	attrs := append(buf[:0],
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingMessageID(m.ID.String()),
		semconv.MessagingConsumerGroupName(t.cfg.Name),
		semconv.CloudEventsEventType(m.Type),
		attribute.Int("messaging.message.delivery_count", attempt))
	if t.system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(t.system))
	}
	if dest != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(dest))
	}
	span.SetAttributes(attrs...)
	clear(attrs) // keep no event's strings alive in the pool
	processAttrsPool.Put(buf)
	return ctx, span
}

// maxProcessAttrs is how many attributes startProcess sets on a process span.
const maxProcessAttrs = 8

// processAttrsPool holds the arrays startProcess passes a span its attributes in: a span
// copies what it is given (it keeps them past the call, in a slice of its own), and a
// fresh array per delivery was the largest allocation of telemetry's own.
var processAttrsPool = sync.Pool{New: func() any { return new([maxProcessAttrs]attribute.KeyValue) }}

// processed records a handler's run on its span and in messaging.process.duration.
func (t *consumerTelemetry) processed(ctx context.Context, span trace.Span, m outbox.Message, dest string, start time.Time, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(telemetry.ErrorType(err)))
	}
	if t.inst.ProcessDuration.Enabled(ctx) {
		t.durationSets.Record(ctx, t.inst.ProcessDuration.Float64Histogram, time.Since(start).Seconds(),
			telemetry.Key{A: m.Type, B: dest, C: telemetry.ErrorType(err)})
	}
}

// settled counts a delivery's outcome in txoutbox.consumer.messages.
func (t *consumerTelemetry) settled(ctx context.Context, m outbox.Message, dest, outcome string) {
	if t.inst.Consumed.Enabled(ctx) {
		t.settledSets.Add(ctx, t.inst.Consumed, 1, telemetry.Key{A: m.Type, B: dest, D: outcome})
	}
}

// retrying logs a handler failure that will be retried, rate-limited: a failing dependency
// fails every message, and the metrics count them all.
func (t *consumerTelemetry) retrying(ctx context.Context, m outbox.Message, attempt int, delay time.Duration, err error) {
	ok, suppressed := t.failLog.Allow()
	if !ok {
		return
	}
	attrs := append(eventAttrs(m, attempt), slog.Duration("retry_in", delay), slog.Any("err", err))
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	t.log.LogAttrs(ctx, slog.LevelWarn, "consumer: handler failed, will retry", attrs...)
}

// logFailure logs a failed ack or nack, rate-limited with retries: a broker outage fails
// them all.
func (t *consumerTelemetry) logFailure(ctx context.Context, msg string, m outbox.Message, attempt int, err error) {
	ok, suppressed := t.failLog.Allow()
	if !ok {
		return
	}
	attrs := append(eventAttrs(m, attempt), slog.Any("err", err))
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	t.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
}

// deadLettered reports a stored dead letter: on the process span, in the counters and to
// the OnDeadLetter hook.
func (t *consumerTelemetry) deadLettered(ctx context.Context, e deadletter.Entry, dest string) {
	m := e.Message
	typ := m.Type
	if e.Kind == deadletter.KindMalformed || e.Kind == deadletter.KindUnknownType {
		typ = telemetry.OtherType
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetStatus(codes.Error, e.Reason)
		span.SetAttributes(telemetry.KindKey.String(string(e.Kind)))
	}
	if t.inst.DeadLetters.Enabled(ctx) {
		t.deadSets.Add(ctx, t.inst.DeadLetters, 1, telemetry.Key{A: typ, B: dest, D: string(e.Kind)})
	}
	if t.inst.Consumed.Enabled(ctx) {
		t.settledSets.Add(ctx, t.inst.Consumed, 1, telemetry.Key{A: typ, B: dest, D: telemetry.DeadLettered})
	}
	if t.cfg.OnDeadLetter != nil {
		t.cfg.OnDeadLetter(ctx, deadletter.Notice{Message: m, Stage: deadletter.StageConsumer,
			Kind: e.Kind, Consumer: t.cfg.Name, Reason: e.Reason, Attempts: e.Attempts, Destination: dest})
	}
}
