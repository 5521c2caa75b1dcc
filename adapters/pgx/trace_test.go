package outboxpgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	outboxmem "github.com/txoutbox/outbox/transports/memory"
)

// TestTraceFollowsTheEvent: the span that published an event is linked from the relay's
// send span and continued by the consumer's span — one trace from request to handler.
func TestTraceFollowsTheEvent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	o := newTestOutbox(t)
	ctx, request := tp.Tracer("app").Start(context.Background(), "POST /orders")
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, outbox.New(outboxtestNote{N: 1})) }); err != nil {
		t.Fatal(err)
	}
	request.End()
	want := request.SpanContext()

	q := outboxmem.New(nil)
	relay, err := outbox.NewRelay(o.store(t), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("relay: %d, %v", n, err)
	}

	c, err := consumer.New(q, &consumer.Config{Name: "tracer", DeadLetters: o.deadLetters(t)})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan trace.SpanContext, 1)
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[outboxtestNote]) error {
		got <- trace.SpanContextFromContext(ctx)
		return nil
	})
	cctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(cctx) }()
	handler := <-got
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if handler.TraceID() != want.TraceID() {
		t.Fatalf("handler runs in trace %s, want the request's %s", handler.TraceID(), want.TraceID())
	}
	var linked bool
	for _, s := range rec.Ended() {
		if s.Name() == "outbox relay send" {
			for _, l := range s.Links() {
				linked = linked || l.SpanContext.SpanID() == want.SpanID()
			}
		}
		if s.Name() == "process outboxpgx_test.note" && s.Parent().SpanID() != want.SpanID() {
			t.Errorf("consumer span's parent is %s, want the request span %s", s.Parent().SpanID(), want.SpanID())
		}
	}
	if !linked {
		t.Fatal("the relay's send span is not linked to the request span")
	}
}
