package telemetry

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestLogLimiterCountsWhatItSuppresses: past Burst lines in a window, lines are suppressed
// and counted; the first line of the next window carries the count.
func TestLogLimiterCountsWhatItSuppresses(t *testing.T) {
	clock := time.Unix(1e9, 0)
	l := LogLimiter{Burst: 2, Window: time.Second, now: func() time.Time { return clock }}
	for i := range 2 {
		if ok, n := l.Allow(); !ok || n != 0 {
			t.Fatalf("line %d: allowed %v, suppressed %d", i+1, ok, n)
		}
	}
	for range 5 {
		if ok, _ := l.Allow(); ok {
			t.Fatal("a line past the burst was allowed")
		}
	}
	clock = clock.Add(time.Second)
	if ok, n := l.Allow(); !ok || n != 5 {
		t.Fatalf("next window: allowed %v, suppressed %d, want true, 5", ok, n)
	}
}

// TestSetsAllocateNothingOnceSeen: a cached attribute set records without allocating.
func TestSetsAllocateNothingOnceSeen(t *testing.T) {
	s := NewSets(func(k Key) []attribute.KeyValue { return []attribute.KeyValue{attribute.String("a", k.A)} })
	s.get(Key{A: "x"})
	if n := testing.AllocsPerRun(100, func() { s.get(Key{A: "x"}) }); n != 0 {
		t.Fatalf("%v allocations per cached lookup", n)
	}
}

// TestLinksParseLikeThePropagator: the fast traceparent reader agrees with the propagator,
// and each distinct publisher is linked once, in order.
func TestLinksParseLikeThePropagator(t *testing.T) {
	hs := []map[string]string{
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
		{"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, // invalid trace id
		{"traceparent": "garbage"},
		{},
	}
	var links []trace.Link
	EachLink(slices.Values(hs), func(l trace.Link) { links = append(links, l) })
	if len(links) != 2 {
		t.Fatalf("%d links, want 2: %v", len(links), links)
	}
	for i, h := range hs[:3:3] {
		want := trace.SpanContextFromContext(Propagator.Extract(context.Background(), propagation.MapCarrier(h)))
		if got := links[map[int]int{0: 0, 1: 0, 2: 1}[i]].SpanContext; !got.Equal(want) {
			t.Errorf("header %d: got %v, the propagator reads %v", i, got, want)
		}
	}
}

// TestPropagatorRoundTrip: what Propagator injects, it extracts, tracestate included, with
// the fast path and with the general one (a traceparent of another version).
func TestPropagatorRoundTrip(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, _ := trace.ParseTraceState("vendor=x")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	h := propagation.MapCarrier{}
	Propagator.Inject(trace.ContextWithRemoteSpanContext(context.Background(), sc), h)
	if got := trace.SpanContextFromContext(Propagator.Extract(context.Background(), h)); !got.Equal(sc) {
		t.Fatalf("extracted %v from %v, want %v", got, h, sc)
	}
	h["traceparent"] = "01" + h["traceparent"][2:] + "-future"
	if got := trace.SpanContextFromContext(Propagator.Extract(context.Background(), h)); got.TraceID() != tid {
		t.Fatalf("a future version's traceparent %q: extracted %v", h["traceparent"], got)
	}
}

// sawTraceparent is a propagator that records whether it was shown a traceparent.
type sawTraceparent struct{ saw *bool }

func (s sawTraceparent) Inject(context.Context, propagation.TextMapCarrier) {}
func (s sawTraceparent) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	*s.saw = *s.saw || c.Get("traceparent") != ""
	return ctx
}
func (s sawTraceparent) Fields() []string { return []string{"traceparent"} }

// TestPropagatorExtractsTraceContextOnce: with the application's propagator installed as
// docs/observability.md shows (TraceContext and Baggage), Propagator reads the trace
// context and the baggage as the composite of the two did, and the application's
// propagator is not shown traceparent again.
func TestPropagatorExtractsTraceContextOnce(t *testing.T) {
	saw := false
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{}, sawTraceparent{&saw}))
	h := propagation.MapCarrier{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "vendor=x",
		"baggage":     "tenant=acme",
	}
	want := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	for _, c := range []propagation.TextMapCarrier{h, propagation.HeaderCarrier{}} {
		if hc, ok := c.(propagation.HeaderCarrier); ok {
			for k, v := range h {
				hc.Set(k, v)
			}
		}
		got, exp := Propagator.Extract(context.Background(), c), want.Extract(context.Background(), c)
		if sc := trace.SpanContextFromContext(got); !sc.Equal(trace.SpanContextFromContext(exp)) || !sc.IsValid() {
			t.Errorf("%T: extracted %v, want %v", c, sc, trace.SpanContextFromContext(exp))
		}
		if b := baggage.FromContext(got).Member("tenant").Value(); b != "acme" {
			t.Errorf("%T: baggage tenant = %q, want acme", c, b)
		}
	}
	if saw {
		t.Error("the application's propagator was shown traceparent: the trace context was extracted twice")
	}
	out := propagation.MapCarrier{}
	Propagator.Inject(Propagator.Extract(context.Background(), h), out)
	if out["traceparent"] != h["traceparent"] || out["baggage"] != h["baggage"] {
		t.Errorf("injected %v, want the traceparent and baggage of %v", out, h)
	}
}
