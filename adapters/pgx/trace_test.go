package outboxpgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// TestTraceFollowsTheEvent: on the memory transport, one trace from the request that
// published an event to the handler (oteltest.ExerciseTrace).
func TestTraceFollowsTheEvent(t *testing.T) {
	t.Parallel()
	o := pgxtest.New(t, "outboxpgx_trace")
	q := outboxmemory.New(&outboxmemory.Config{Name: "notes"})
	f := o.Pipeline(t, q, q)
	f.RetryBackoff = 10 * time.Millisecond
	oteltest.ExerciseTrace(t, &oteltest.TraceFixture{PipelineFixture: f})
}

// TestSendSpanLinksEveryPublisher: a send of 300 events published by 300 requests links to
// all of them, spread over spans of at most 128 links (the SDK's default limit), none
// dropped.
func TestSendSpanLinksEveryPublisher(t *testing.T) {
	t.Parallel()
	tp, rec := oteltest.Tracing(t)
	o := pgxtest.New(t, "outboxpgx_links")
	want := map[trace.SpanID]bool{}
	for i := range 300 {
		ctx, span := tp.Tracer("app").Start(context.Background(), "request")
		if err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
			return o.Publish(ctx, tx, outbox.New(outboxtest.Note{N: i}))
		}); err != nil {
			t.Fatal(err)
		}
		span.End()
		want[span.SpanContext().SpanID()] = true
	}
	relay, err := relay.New(o.Store(t), outboxmemory.New(nil), &relay.Config{TracerProvider: tp, BatchSize: 500})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(context.Background()); n != 300 || err != nil {
		t.Fatalf("relay: %d, %v", n, err)
	}
	got := map[trace.SpanID]bool{}
	spans := 0
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindProducer {
			continue
		}
		spans++
		if len(s.Links()) > 128 || s.DroppedLinks() > 0 {
			t.Errorf("span %q has %d links and dropped %d", s.Name(), len(s.Links()), s.DroppedLinks())
		}
		for _, l := range s.Links() {
			got[l.SpanContext.SpanID()] = true
		}
	}
	if spans != 3 || len(got) != len(want) {
		t.Fatalf("%d send spans link %d publishers, want 3 spans linking all %d", spans, len(got), len(want))
	}
}

// TestLinkTraceStartsANewTrace: with consumer.Config.LinkTrace the process span is the root
// of a trace of its own, linked to the span that published the event.
func TestLinkTraceStartsANewTrace(t *testing.T) {
	t.Parallel()
	tp, rec := oteltest.Tracing(t)
	o := pgxtest.New(t, "outboxpgx_linktrace")
	ctx, request := tp.Tracer("app").Start(context.Background(), "request")
	if err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, outbox.New(outboxtest.Note{})) }); err != nil {
		t.Fatal(err)
	}
	request.End()
	q := outboxmemory.New(nil)
	relay, err := relay.New(o.Store(t), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("relay: %d, %v", n, err)
	}
	c, err := consumer.New(q, &consumer.Config{Name: "linked", DeadLetters: o.DeadLetters(t), TracerProvider: tp, LinkTrace: true})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan struct{})
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[outboxtest.Note]) error { close(handled); return nil })
	cctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(cctx) }()
	<-handled
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := request.SpanContext()
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		if s.Parent().IsValid() || s.SpanContext().TraceID() == want.TraceID() {
			t.Errorf("process span has parent %v in trace %s: want a new root", s.Parent().SpanID(), s.SpanContext().TraceID())
		}
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != want.SpanID() {
			t.Errorf("process span links %v, want the request span %s", s.Links(), want.SpanID())
		}
		return
	}
	t.Fatal("no process span recorded")
}
