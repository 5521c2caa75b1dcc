package relay

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/telemetry"
	"github.com/txoutbox/outbox/outboxdriver"
)

// relayTelemetry is the relay's tracing, metrics, logs and OnDeadLetter hook. With no SDK
// installed it costs a few branches per batch: spans do not record and instruments report
// Enabled false, so nothing is computed per message.
type relayTelemetry struct {
	cfg      *Config
	tracer   trace.Tracer
	meter    metric.Meter
	inst     *telemetry.Instruments
	describe outbox.Describer // nil when the Sender does not describe itself
	system   string
	log      *slog.Logger
	retryLog telemetry.LogLimiter

	sentSets, durationSets, latencySets, deadSets *telemetry.Sets
	claimedOpts                                   []metric.RecordOption // the batch size's attributes
}

// outboxAttrs is the attribute naming the relay's outbox in a Group (none outside one),
// added to every metric and span of the relay.
func (c *Config) outboxAttrs() []attribute.KeyValue {
	if c.outbox == "" {
		return nil
	}
	return []attribute.KeyValue{telemetry.OutboxKey.String(c.outbox)}
}

var sendSpanKind = trace.WithSpanKind(trace.SpanKindProducer)

func (t *relayTelemetry) init(cfg *Config, sender outbox.Sender) {
	t.cfg = cfg
	t.tracer = telemetry.Tracer(cfg.TracerProvider)
	t.meter = telemetry.Meter(cfg.MeterProvider)
	t.log = cfg.Logger.With("relay", cfg.Name)
	inst, err := telemetry.NewInstruments(t.meter)
	if err != nil {
		t.log.Warn("outbox relay: some metrics are unavailable", "err", err)
	}
	t.inst = inst
	if d, ok := sender.(outbox.Describer); ok {
		t.describe, t.system = d, d.MessagingSystem()
	}
	base := func(k telemetry.Key) []attribute.KeyValue {
		kv := append(make([]attribute.KeyValue, 0, 7), cfg.outboxAttrs()...)
		if t.system != "" {
			kv = append(kv, semconv.MessagingSystemKey.String(t.system))
		}
		if k.B != "" {
			kv = append(kv, semconv.MessagingDestinationName(k.B))
		}
		if k.A != "" {
			kv = append(kv, semconv.CloudEventsEventType(k.A))
		}
		return kv
	}
	send := func(k telemetry.Key) []attribute.KeyValue {
		kv := append(base(k), semconv.MessagingOperationName("send"))
		if k.C != "" {
			kv = append(kv, semconv.ErrorTypeKey.String(k.C))
		}
		return kv
	}
	if kv := cfg.outboxAttrs(); kv != nil {
		t.claimedOpts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
	}
	t.sentSets = telemetry.NewSets(send)
	t.durationSets = telemetry.NewSets(send)
	t.latencySets = telemetry.NewSets(base)
	t.deadSets = telemetry.NewSets(func(k telemetry.Key) []attribute.KeyValue {
		return append(base(k), telemetry.StageKey.String("relay"), telemetry.KindKey.String(k.D))
	})
}

// destination is where m goes, by the Sender's own account.
func (t *relayTelemetry) destination(m outbox.Message) string {
	if t.describe == nil {
		return ""
	}
	return t.describe.DestinationName(m)
}

// claimed records the size of a non-empty claim.
func (t *relayTelemetry) claimed(ctx context.Context, n int) {
	if t.inst.BatchSize.Enabled(ctx) {
		t.inst.BatchSize.Record(ctx, int64(n), t.claimedOpts...)
	}
}

// startSend starts the producer span of one Send: "send <destination>" (or "send" when the
// batch goes to several). Its links come with sent.
func (t *relayTelemetry) startSend(ctx context.Context, msgs []outbox.Message) (context.Context, *sendSpan) {
	start := time.Now()
	ctx, span := t.tracer.Start(ctx, "send", sendSpanKind, trace.WithTimestamp(start))
	s := &sendSpan{Span: span, ctx: ctx, start: start, name: "send"}
	if !span.IsRecording() {
		return ctx, s
	}
	dest := ""
	for i, m := range msgs {
		d := t.destination(m)
		if i > 0 && d != dest {
			dest = ""
			break
		}
		dest = d
	}
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingBatchMessageCount(len(msgs)),
		telemetry.RelayKey.String(t.cfg.Name))
	attrs = append(attrs, t.cfg.outboxAttrs()...)
	if t.system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(t.system))
	}
	if dest != "" {
		s.name = "send " + dest
		span.SetName(s.name)
		attrs = append(attrs, semconv.MessagingDestinationName(dest))
	}
	if len(msgs) == 1 {
		attrs = append(attrs, semconv.MessagingMessageID(msgs[0].ID.String()))
	}
	span.SetAttributes(attrs...)
	s.attrs = attrs
	return ctx, s
}

// sendSpan is a send's span, and the child spans that carry its links past MaxLinks.
type sendSpan struct {
	trace.Span
	ctx   context.Context // the span's
	start time.Time
	name  string
	attrs []attribute.KeyValue
	parts []trace.Span
}

// link links the span to the spans that published msgs. Past telemetry.MaxLinks distinct
// publishers the links go on child spans of the same name and times, so the SDK's link
// limit never drops one.
func (s *sendSpan) link(t *relayTelemetry, msgs []outbox.Message) {
	cur, n := trace.Span(s.Span), 0
	telemetry.EachLink(func(yield func(map[string]string) bool) {
		for _, m := range msgs {
			if !yield(m.Headers) {
				return
			}
		}
	}, func(l trace.Link) {
		if n == telemetry.MaxLinks {
			_, cur = t.tracer.Start(s.ctx, s.name, sendSpanKind, trace.WithTimestamp(s.start),
				trace.WithAttributes(s.attrs...))
			s.parts = append(s.parts, cur)
			n = 0
		}
		cur.AddLink(l)
		n++
	})
}

func (s *sendSpan) end(err error, at time.Time) {
	for _, p := range append(s.parts, s.Span) {
		if err != nil {
			p.RecordError(err, trace.WithTimestamp(at))
			p.SetStatus(codes.Error, err.Error())
			p.SetAttributes(semconv.ErrorTypeKey.String(telemetry.ErrorType(err)))
		}
		p.End(trace.WithTimestamp(at))
	}
}

// sent ends the span of one Send (started at start) and records its metrics: each message
// sent or failed, the call's duration, and each delivered message's latency since its
// creation. The work per message (the span's links, the latencies and the counts) is done
// by a goroutine of pending, beside the relay's write-back of the batch instead of before
// it; times are the send's, taken here.
func (t *relayTelemetry) sent(ctx context.Context, span *sendSpan, msgs []outbox.Message, start time.Time, err error,
	failed map[int]error, pending *sync.WaitGroup) {
	now := time.Now()
	measure := t.inst.Sent.Enabled(ctx) || t.inst.SendDuration.Enabled(ctx) || t.inst.Latency.Enabled(ctx)
	if !span.IsRecording() && !measure {
		span.End() // with no SDK, nothing to do
		return
	}
	ctx = context.WithoutCancel(ctx) // the send's, which ends when it returns
	pending.Go(func() {
		if span.IsRecording() {
			span.link(t, msgs)
		}
		span.end(err, now)
		if measure {
			t.measure(ctx, msgs, now.Sub(start), now, err, failed)
		}
	})
}

// measure records the metrics of a send of msgs that lasted elapsed and ended at now.
func (t *relayTelemetry) measure(ctx context.Context, msgs []outbox.Message, elapsed time.Duration, now time.Time, err error, failed map[int]error) {
	dest, mixed := "", false
	counts := make(map[telemetry.Key]int64, 4)
	// Latencies are per message, and a message's trace is not the send span's: recorded
	// without it, they take no exemplar of it. A batch is mostly one type to one
	// destination: messages are counted by runs of one key, and the options of the last
	// key are reused.
	lctx := context.Background()
	var (
		run     telemetry.Key
		runLen  int64
		lastRec []metric.RecordOption
		lastKey telemetry.Key
	)
	for i, m := range msgs {
		d := t.destination(m)
		if i > 0 && d != dest {
			mixed = true
		}
		dest = d
		k := telemetry.Key{A: m.Type, B: d}
		if e, bad := failed[i]; bad {
			k.C = telemetry.ErrorType(e)
		} else {
			if lastRec == nil || k != lastKey {
				lastKey, lastRec = k, t.latencySets.RecordOptions(k)
			}
			t.inst.Latency.Record(lctx, now.Sub(m.CreatedAt).Seconds(), lastRec...)
		}
		if runLen > 0 && k != run {
			counts[run] += runLen
			runLen = 0
		}
		run = k
		runLen++
	}
	if runLen > 0 {
		counts[run] += runLen
	}
	for k, n := range counts {
		t.sentSets.Add(ctx, t.inst.Sent.Int64Counter, n, k)
	}
	if mixed {
		dest = ""
	}
	t.durationSets.Record(ctx, t.inst.SendDuration.Float64Histogram, elapsed.Seconds(),
		telemetry.Key{B: dest, C: telemetry.ErrorType(err)})
}

// retrying logs a failed send that will be retried, rate-limited: an outage fails every
// message, and the metrics count them all.
func (t *relayTelemetry) retrying(ctx context.Context, c outboxdriver.Claimed, delay time.Duration, err error) {
	ok, suppressed := t.retryLog.Allow()
	if !ok {
		return
	}
	attrs := []slog.Attr{slog.String("event_id", c.Message.ID.String()), slog.String("type", c.Message.Type),
		slog.String("key", c.Message.Key), slog.Int("attempt", c.Attempts), slog.Duration("retry_in", delay),
		slog.Any("err", err)}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	t.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: send failed, will retry", attrs...)
}

// deadLettered reports the dead letters that the store moved: a log line, the counter and
// the OnDeadLetter hook, once each. Rows the store did not move (their lease was taken over
// by another relay, which reports them itself) are left out.
func (t *relayTelemetry) deadLettered(ctx context.Context, out *outcome, moved []int64) {
	if len(moved) == 0 {
		return
	}
	was := make(map[int64]bool, len(moved))
	for _, seq := range moved {
		was[seq] = true
	}
	count := t.inst.DeadLetters.Enabled(ctx)
	for i, d := range out.dead {
		if !was[d.Seq] {
			continue
		}
		c := out.deadClaims[i]
		m := c.Message
		dest := t.destination(m)
		t.log.LogAttrs(ctx, slog.LevelError, "outbox relay: message dead-lettered",
			slog.Int64("seq", d.Seq), slog.String("event_id", m.ID.String()), slog.String("type", m.Type),
			slog.String("key", m.Key), slog.Int("attempt", c.Attempts), slog.String("kind", string(d.Kind)),
			slog.String("reason", d.Reason))
		if count {
			t.deadSets.Add(ctx, t.inst.DeadLetters, 1, telemetry.Key{A: m.Type, B: dest, D: string(d.Kind)})
		}
		if t.cfg.OnDeadLetter != nil {
			t.cfg.OnDeadLetter(ctx, deadletter.Notice{Message: m, Stage: deadletter.StageRelay, Kind: d.Kind, Reason: d.Reason,
				Attempts: c.Attempts, Destination: dest})
		}
	}
}

// observeStats registers the outbox gauges, sampled by one sr.Stats per collection, and
// returns their unregistration.
func (t *relayTelemetry) observeStats(sr outboxdriver.StatsReader) func() {
	i := t.inst
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		st, err := sr.Stats(ctx)
		if err != nil {
			return err
		}
		name := st.Outbox
		if t.cfg.outbox != "" { // in a Group: the outbox's name there, unique in the group
			name = t.cfg.outbox
		}
		set := metric.WithAttributeSet(attribute.NewSet(telemetry.OutboxKey.String(name)))
		now := time.Now()
		o.ObserveInt64(i.Backlog, st.Backlog, set)
		o.ObserveFloat64(i.BacklogAge, age(now, st.OldestUndelivered), set)
		o.ObserveInt64(i.DeadLettersPending, st.DeadLettersPending, set)
		o.ObserveFloat64(i.DeadLetterAge, age(now, st.OldestPendingDeadLetter), set)
		o.ObserveInt64(i.HeldKeys, st.HeldKeys, set)
		if st.Slot != nil && st.Slot.Exists {
			o.ObserveInt64(i.SlotRetainedWAL, st.Slot.RetainedWAL, set)
			o.ObserveInt64(i.SlotLag, st.Slot.Lag, set)
		}
		return nil
	}, i.Backlog, i.BacklogAge, i.DeadLettersPending, i.DeadLetterAge, i.HeldKeys, i.SlotRetainedWAL, i.SlotLag)
	if err != nil {
		t.log.Warn("outbox relay: the outbox gauges are unavailable", "err", err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// age is the seconds from then to now, 0 for a zero then (nothing waiting).
func age(now, then time.Time) float64 {
	if then.IsZero() {
		return 0
	}
	return max(now.Sub(then).Seconds(), 0)
}
