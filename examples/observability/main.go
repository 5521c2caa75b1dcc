// Command observability is a small order service run with OpenTelemetry installed: an HTTP
// request places an order and publishes its event in one transaction, the relay sends it,
// a consumer reserves stock for it — and the whole path is one trace, with the metrics an
// operator alerts on served at /metrics by the OpenTelemetry Prometheus exporter.
//
// Traces go to stdout (JSON), or over OTLP/HTTP when $OTEL_EXPORTER_OTLP_ENDPOINT is set.
// The program places three orders (one handled, one whose handler fails once and is
// retried, one that is refused and dead-lettered), prints the trace of the retried one and
// the metric lines, and exits; with -serve it keeps serving on 127.0.0.1 for curl.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// OrderPlaced is published when an order is placed.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Quantity int    `json:"quantity"`
}

// EventType names the event on the wire.
func (OrderPlaced) EventType() string { return "orders.placed" }

type config struct {
	PGURL string
	Addr  string    // where the HTTP server listens (loopback)
	Serve bool      // keep serving after the demo
	Spans io.Writer // where the stdout exporter writes spans (when OTLP is not configured)
}

func main() {
	cfg := config{PGURL: os.Getenv("TXOUTBOX_PG_URL"), Spans: os.Stdout}
	if cfg.PGURL == "" {
		cfg.PGURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:8080", "HTTP address (POST /orders, GET /metrics)")
	flag.BoolVar(&cfg.Serve, "serve", false, "keep serving after the demo orders")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		log.Fatal(err)
	}
}

// setupTelemetry installs the SDK as the global providers — txoutbox uses them unless its
// configs name others — and returns the Prometheus registry to serve, the spans recorded
// in memory (for the demo's printout), and the shutdown that flushes the exporters.
func setupTelemetry(ctx context.Context, spans io.Writer) (*prometheus.Registry, *tracetest.SpanRecorder, func(context.Context) error, error) {
	var exp sdktrace.SpanExporter
	var err error
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exp, err = otlptracehttp.New(ctx) // reads the endpoint, headers… from OTEL_EXPORTER_OTLP_*
	} else {
		exp, err = stdouttrace.New(stdouttrace.WithWriter(spans))
	}
	if err != nil {
		return nil, nil, nil, err
	}
	res := resource.NewSchemaless(semconv.ServiceName("orders"))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp), sdktrace.WithSpanProcessor(rec))
	reg := prometheus.NewRegistry()
	prom, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(prom))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	shutdown := func(ctx context.Context) error { return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx)) }
	return reg, rec, shutdown, nil
}

// run starts the service, places the demo orders, prints their trace and metrics to w, and
// serves until ctx ends if cfg.Serve.
func run(ctx context.Context, w io.Writer, cfg config) error {
	reg, rec, shutdown, err := setupTelemetry(ctx, cfg.Spans)
	if err != nil {
		return err
	}
	defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()

	pool, err := pgxpool.New(ctx, cfg.PGURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The demo's own schema, dropped when it starts and ends.
	const schema = "txoutbox_observability"
	box, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		return err
	}
	dropSchema := func() { _, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") }
	dropSchema()
	defer dropSchema()
	if err := box.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id text PRIMARY KEY, quantity int NOT NULL)"); err != nil {
		return err
	}
	store, err := box.NewStore(pool)
	if err != nil {
		return err
	}
	deadLetters, err := box.NewDeadLetters(pool)
	if err != nil {
		return err
	}

	// An alert without a metrics stack: both stages call this once per new dead letter.
	var alerts []string
	var mu sync.Mutex
	page := func(_ context.Context, d deadletter.Notice) {
		mu.Lock()
		defer mu.Unlock()
		alerts = append(alerts, fmt.Sprintf("PAGE: %s (key %s) dead-lettered at the %s stage (%s) after %d attempt(s): %s",
			d.Message.Type, d.Message.Key, d.Stage, d.Kind, d.Attempts, d.Reason))
	}

	queue := outboxmemory.New(&outboxmemory.Config{Name: "orders"})
	rl, err := relay.New(store, queue, &relay.Config{OnDeadLetter: page})
	if err != nil {
		return err
	}
	var o2Failed atomic.Bool
	c, err := consumer.New(queue, &consumer.Config{Name: "inventory", DeadLetters: deadLetters, OnDeadLetter: page,
		RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	consumer.Handle(c, outboxpgx.Idempotent(box, pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[OrderPlaced]) error {
		ctx, span := otel.Tracer("inventory").Start(ctx, "reserve stock")
		defer span.End()
		span.SetAttributes(attribute.String("order.id", e.Payload.OrderID))
		switch {
		case e.Payload.Quantity <= 0:
			return outbox.Permanent(fmt.Errorf("order %s has quantity %d", e.Payload.OrderID, e.Payload.Quantity))
		case e.Payload.OrderID == "o-2" && o2Failed.CompareAndSwap(false, true):
			return errors.New("inventory service unavailable")
		}
		return nil
		// One transaction per event, so that the printed trace is the same on every run: with
		// group commit (the default, nil), o-2's failure inside a batch would be retried alone
		// within the same delivery, and its failed attempt would not always show.
	}, &idempotency.GroupConfig{MaxEvents: 1}))

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /orders", func(rw http.ResponseWriter, r *http.Request) {
		ctx, span := otel.Tracer("orders").Start(r.Context(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		o := OrderPlaced{OrderID: r.FormValue("id"), Quantity: atoi(r.FormValue("quantity"))}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders VALUES ($1, $2)", o.OrderID, o.Quantity); err != nil {
				return err
			}
			return box.Publish(ctx, tx, outbox.New(o, outbox.WithKey(o.OrderID)))
		})
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		rl.Wake()
		rw.WriteHeader(http.StatusCreated)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown(context.WithoutCancel(ctx)) }()

	bg, stopBg := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = rl.Run(bg) })
	wg.Go(func() { _ = c.Run(bg) })
	defer func() { stopBg(); wg.Wait() }()

	base := "http://" + ln.Addr().String()
	for _, o := range []struct {
		id  string
		qty int
	}{{"o-1", 2}, {"o-2", 1}, {"o-3", 0}} {
		resp, err := http.PostForm(base+"/orders", map[string][]string{"id": {o.id}, "quantity": {fmt.Sprint(o.qty)}})
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		fmt.Fprintf(w, "POST /orders id=%s quantity=%d → %d\n", o.id, o.qty, resp.StatusCode)
	}
	// Settled: o-1 once, o-2 twice (a failure, then its retry), o-3 dead-lettered, and the
	// relay's deletes committed (the consumer can handle a message before the relay has
	// marked it delivered, so the backlog gauge would still count it).
	stats := store.(outboxdriver.StatsReader)
	err = waitUntil(ctx, "the orders to be settled", func() bool {
		if st, err := stats.Stats(ctx); err != nil || st.Backlog != 0 {
			return false
		}
		n := 0
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				n++
			}
		}
		mu.Lock()
		defer mu.Unlock()
		return n == 4 && len(alerts) == 1
	})
	if err != nil {
		return err
	}
	mu.Lock()
	fmt.Fprintln(w, alerts[0])
	mu.Unlock()

	printTrace(w, rec.Ended(), "o-2")
	if err := printMetrics(ctx, w, base+"/metrics"); err != nil {
		return err
	}
	if cfg.Serve {
		fmt.Fprintf(w, "serving on %s: curl -d id=o-4 -d quantity=1 %s/orders; curl %s/metrics (Ctrl-C stops)\n", base, base, base)
		<-ctx.Done()
	}
	return nil
}

// printTrace prints the trace of order id's request as a tree, and the relay's send span
// that links to it from a trace of its own.
func printTrace(w io.Writer, spans []sdktrace.ReadOnlySpan, id string) {
	var request sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "reserve stock" && attr(s, "order.id") == id {
			for _, r := range spans {
				if r.Name() == "POST /orders" && r.SpanContext().TraceID() == s.SpanContext().TraceID() {
					request = r
				}
			}
		}
	}
	if request == nil {
		fmt.Fprintf(w, "no trace recorded for %s\n", id)
		return
	}
	tid := request.SpanContext().TraceID()
	var in []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() == tid {
			in = append(in, s)
		}
	}
	slices.SortFunc(in, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	fmt.Fprintf(w, "trace of order %s: %d spans, one trace id\n", id, len(in))
	var walk func(parent trace.SpanID, depth int)
	walk = func(parent trace.SpanID, depth int) {
		for _, s := range in {
			if s.Parent().SpanID() != parent {
				continue
			}
			line := fmt.Sprintf("%s%s [%s]", strings.Repeat("  ", depth+1), s.Name(), s.SpanKind())
			if n := attr(s, "messaging.message.delivery_count"); n != "" {
				line += " attempt " + n
			}
			if s.Status().Description != "" {
				line += ": error " + s.Status().Description
			}
			fmt.Fprintln(w, line)
			walk(s.SpanContext().SpanID(), depth+1)
		}
	}
	walk(trace.SpanID{}, 0)
	for _, s := range spans {
		for _, l := range s.Links() {
			if l.SpanContext.SpanID() == request.SpanContext().SpanID() {
				fmt.Fprintf(w, "  linked from %s [%s] (the relay's trace), messaging.system=%s\n", s.Name(), s.SpanKind(), attr(s, "messaging.system"))
			}
		}
	}
}

// waitUntil polls cond until it holds, for at most 30s.
func waitUntil(ctx context.Context, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// shown are the metric lines the demo prints: the counts, which do not depend on timing.
var shown = []string{
	"messaging_client_sent_messages_total", "txoutbox_consumer_messages_total", "txoutbox_dead_letters_added_total",
	"txoutbox_outbox_backlog", "txoutbox_dead_letters_pending", "txoutbox_relay_latency_seconds_count",
	"messaging_process_duration_seconds_count",
}

// printMetrics scrapes url and prints the lines of the metrics in shown.
func printMetrics(ctx context.Context, w io.Writer, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	fmt.Fprintln(w, "GET /metrics (the counts):")
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, "{")
		if slices.Contains(shown, name) {
			fmt.Fprintln(w, "  "+line)
		}
	}
	return sc.Err()
}

func atoi(s string) int {
	var n int
	_, _ = fmt.Sscan(s, &n)
	return n
}
