// Package oteltest proves txoutbox's telemetry with the OpenTelemetry SDK: in-memory span
// recording, a manual metric reader, and [ExerciseTrace], which every transport runs to show
// one trace from the request that published an event to the handler that processed it
// (third-party transports can run it too). It lives in the outboxpgx module, which every
// transport's tests require already, so that the core module keeps the OpenTelemetry API
// only. It is for authors of transports, in their tests.
package oteltest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
)

// Tracing returns a tracer provider of the SDK that records every ended span in memory; it
// is shut down when t ends.
func Tracing(t testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// Metrics returns a meter provider of the SDK read by a manual reader: each Collect is one
// collection, running the gauges' callbacks once.
func Metrics(t testing.TB) (*sdkmetric.MeterProvider, *Reader) {
	r := &Reader{ManualReader: sdkmetric.NewManualReader(), t: t}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.ManualReader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp, r
}

// Reader collects metrics for assertions.
type Reader struct {
	*sdkmetric.ManualReader
	t testing.TB
}

// Snapshot is one collection.
type Snapshot struct{ metricdata.ResourceMetrics }

// Collect runs one collection.
func (r *Reader) Collect() Snapshot {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.ManualReader.Collect(context.Background(), &rm); err != nil {
		r.t.Fatal(err)
	}
	return Snapshot{rm}
}

// Names returns the names of the metrics collected.
func (s Snapshot) Names() []string {
	var names []string
	for _, sm := range s.ScopeMetrics {
		for _, m := range sm.Metrics {
			names = append(names, m.Name)
		}
	}
	slices.Sort(names)
	return names
}

func (s Snapshot) find(name string) (metricdata.Metrics, bool) {
	for _, sm := range s.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// matches reports whether set has every attribute of want (key=value; key=* for present;
// key= for absent).
func matches(set attribute.Set, want []string) bool {
	for _, w := range want {
		k, v, _ := strings.Cut(w, "=")
		got, ok := set.Value(attribute.Key(k))
		switch {
		case v == "":
			if ok {
				return false
			}
		case v == "*":
			if !ok {
				return false
			}
		case !ok || got.Emit() != v:
			return false
		}
	}
	return true
}

// Value sums the points of metric name whose attributes match want ("key=value", "key=*"
// for present, "key=" for absent): a counter's or gauge's value, a histogram's count.
func (s Snapshot) Value(name string, want ...string) float64 {
	m, ok := s.find(name)
	if !ok {
		return 0
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		return sum(d.DataPoints, want, func(p metricdata.DataPoint[int64]) (attribute.Set, float64) { return p.Attributes, float64(p.Value) })
	case metricdata.Sum[float64]:
		return sum(d.DataPoints, want, func(p metricdata.DataPoint[float64]) (attribute.Set, float64) { return p.Attributes, p.Value })
	case metricdata.Gauge[int64]:
		return sum(d.DataPoints, want, func(p metricdata.DataPoint[int64]) (attribute.Set, float64) { return p.Attributes, float64(p.Value) })
	case metricdata.Gauge[float64]:
		return sum(d.DataPoints, want, func(p metricdata.DataPoint[float64]) (attribute.Set, float64) { return p.Attributes, p.Value })
	case metricdata.Histogram[int64]:
		return sum(d.DataPoints, want, func(p metricdata.HistogramDataPoint[int64]) (attribute.Set, float64) {
			return p.Attributes, float64(p.Count)
		})
	case metricdata.Histogram[float64]:
		return sum(d.DataPoints, want, func(p metricdata.HistogramDataPoint[float64]) (attribute.Set, float64) {
			return p.Attributes, float64(p.Count)
		})
	}
	return 0
}

// sum adds up the values of the points whose attributes match want.
func sum[P any](points []P, want []string, read func(P) (attribute.Set, float64)) float64 {
	var total float64
	for _, p := range points {
		if set, v := read(p); matches(set, want) {
			total += v
		}
	}
	return total
}

// Attr returns the value of key on span s ("" when absent).
func Attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TraceFixture is a pipeline whose trace ExerciseTrace follows.
type TraceFixture struct {
	*outboxtest.PipelineFixture
	// ProcessDestination is the consumer span's messaging.destination.name when it is not
	// the sender's (RabbitMQ sends to an exchange and receives from a queue).
	ProcessDestination string
}

// ExerciseTrace proves, on a real broker, one trace from request to handler: a request span
// publishes an event; the relay's "send <destination>" producer span links to it; the
// consumer's "process <destination>" consumer span is its child, on every attempt; the
// handler's own span is the process span's child — all in the request's trace, with the
// messaging conventions' attributes, and the handler's first failure recorded as an error.
// The Sender and Receiver must describe themselves (outbox.Describer).
func ExerciseTrace(t *testing.T, f *TraceFixture) {
	t.Helper()
	if f.Timeout == 0 {
		f.Timeout = 60 * time.Second
	}
	if f.RetryBackoff == 0 {
		f.RetryBackoff = time.Second
	}
	sd, ok := f.Sender.(outbox.Describer)
	if !ok {
		t.Fatalf("%T does not implement outbox.Describer", f.Sender)
	}
	rd, ok := f.Receiver.(outbox.Describer)
	if !ok {
		t.Fatalf("%T does not implement outbox.Describer", f.Receiver)
	}
	system := sd.MessagingSystem()
	if system == "" || rd.MessagingSystem() != system {
		t.Fatalf("the sender's messaging system is %q, the receiver's %q", system, rd.MessagingSystem())
	}

	tp, rec := Tracing(t)
	ctx := context.Background()
	rctx, request := tp.Tracer("app").Start(ctx, "POST /notes", trace.WithSpanKind(trace.SpanKindServer))
	ev := outbox.New(outboxtest.Note{Text: "traced"})
	if err := f.Publish(rctx, ev); err != nil {
		t.Fatal(err)
	}
	request.End()
	want := request.SpanContext()
	m, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	dest := sd.DestinationName(m)
	pdest := f.ProcessDestination
	if pdest == "" {
		pdest = dest
	}
	if dest == "" {
		t.Fatal("the sender names no destination for the event")
	}

	relay, err := relay.New(f.Store, f.Sender, &relay.Config{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, f.Timeout, "the relay to send the event", func() bool {
		n, err := relay.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})

	c, err := consumer.New(f.Receiver, &consumer.Config{Name: "traced", DeadLetters: f.DeadLetters,
		TracerProvider: tp, RetryBackoff: f.RetryBackoff, MaxRetryBackoff: f.RetryBackoff})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		handlers []trace.SpanContext
	)
	done := make(chan struct{})
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[outboxtest.Note]) error {
		_, span := tp.Tracer("app").Start(ctx, "handle note")
		defer span.End()
		mu.Lock()
		defer mu.Unlock()
		handlers = append(handlers, span.SpanContext())
		if len(handlers) == 1 {
			return errors.New("first attempt fails")
		}
		close(done)
		return nil
	})
	cctx, stop := context.WithCancel(ctx)
	ran := make(chan error)
	go func() { ran <- c.Run(cctx) }()
	select {
	case <-done:
	case <-time.After(f.Timeout):
		t.Error("the event was not handled after its retry in time")
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}

	var sends, processes, handles []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch {
		case s.SpanKind() == trace.SpanKindProducer:
			sends = append(sends, s)
		case s.SpanKind() == trace.SpanKindConsumer:
			processes = append(processes, s)
		case s.Name() == "handle note":
			handles = append(handles, s)
		}
	}
	if len(sends) != 1 || len(processes) != 2 || len(handles) != 2 {
		t.Fatalf("recorded %d send, %d process and %d handler spans, want 1, 2 (a failure, a retry) and 2",
			len(sends), len(processes), len(handles))
	}
	check := func(s sdktrace.ReadOnlySpan, attrs map[string]string) {
		t.Helper()
		for k, v := range attrs {
			if got := Attr(s, k); got != v {
				t.Errorf("span %q: %s = %q, want %q", s.Name(), k, got, v)
			}
		}
	}
	send := sends[0]
	if send.Name() != "send "+dest {
		t.Errorf("send span named %q, want %q", send.Name(), "send "+dest)
	}
	check(send, map[string]string{
		"messaging.system": system, "messaging.destination.name": dest, "messaging.operation.type": "send",
		"messaging.operation.name": "send", "messaging.batch.message_count": "1", "messaging.message.id": ev.ID.String(),
	})
	if !slices.ContainsFunc(send.Links(), func(l sdktrace.Link) bool {
		return l.SpanContext.TraceID() == want.TraceID() && l.SpanContext.SpanID() == want.SpanID()
	}) {
		t.Errorf("the send span's links %v miss the publishing span %s", send.Links(), want.SpanID())
	}
	if send.SpanContext().TraceID() == want.TraceID() {
		t.Error("the send span is in the request's trace: it should link to it, being one send for many requests")
	}
	slices.SortFunc(processes, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	for i, p := range processes {
		if p.Name() != "process "+pdest {
			t.Errorf("process span named %q, want %q", p.Name(), "process "+pdest)
		}
		if p.Parent().SpanID() != want.SpanID() || p.SpanContext().TraceID() != want.TraceID() {
			t.Errorf("process span %d has parent %s in trace %s, want the request span %s in %s",
				i+1, p.Parent().SpanID(), p.SpanContext().TraceID(), want.SpanID(), want.TraceID())
		}
		check(p, map[string]string{
			"messaging.system": system, "messaging.destination.name": pdest, "messaging.operation.type": "process",
			"messaging.operation.name": "process", "messaging.message.id": ev.ID.String(),
			"messaging.consumer.group.name": "traced", "messaging.message.delivery_count": fmt.Sprint(i + 1),
		})
		h := handles[slices.IndexFunc(handles, func(h sdktrace.ReadOnlySpan) bool { return h.SpanContext().Equal(handlers[i]) })]
		if h.Parent().SpanID() != p.SpanContext().SpanID() || h.SpanContext().TraceID() != want.TraceID() {
			t.Errorf("handler span %d is not the child of its process span", i+1)
		}
	}
	failed, retried := processes[0], processes[1]
	if failed.Status().Code != codes.Error || !strings.Contains(failed.Status().Description, "first attempt fails") ||
		!slices.ContainsFunc(failed.Events(), func(e sdktrace.Event) bool { return e.Name == "exception" }) {
		t.Errorf("the failed attempt's span has status %+v and events %v, want the error recorded", failed.Status(), failed.Events())
	}
	if retried.Status().Code == codes.Error {
		t.Errorf("the successful attempt's span has status %+v", retried.Status())
	}
}
