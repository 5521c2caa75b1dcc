package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/txoutbox/outbox"
)

func (a *app) relay(ctx context.Context, args []string) error {
	fs := a.flags("relay", "--transport URL [--route TYPE=DEST]... [flags]")
	var f dbFlags
	f.add(a, fs)
	transportURL := fs.String("transport", a.getenv("OUTBOX_TRANSPORT_URL"), transportHelp+"\n(env OUTBOX_TRANSPORT_URL)")
	var routes stringsFlag
	fs.Var(&routes, "route", "send events of a type to their own destination: TYPE=QUEUE, TYPE=SUBJECT, TYPE=TOPIC or TYPE=ROUTING_KEY (repeat it)")
	listen := fs.String("listen", "127.0.0.1:9464", "serve GET /healthz and GET /metrics (Prometheus) here; \"\" for neither. Loopback by default: expose it on purpose")
	name := fs.String("name", "", "the relay's name in leases and logs (default host:pid:random)")
	batch := fs.Int("batch-size", 0, "messages per claim (default 500)")
	attempts := fs.Int("max-attempts", 0, "delivery attempts before a message is dead-lettered (default 10)")
	lease := fs.Duration("lease", 0, "how long a claim stays with this relay (default 30s)")
	concurrency := fs.Int("concurrency", 0, "claim, send and write-back loops at once (default 2)")
	logFormat := fs.String("log-format", "text", "text or json")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	if *transportURL == "" {
		return usagef("relay needs --transport (or OUTBOX_TRANSPORT_URL):\n%s", transportHelp)
	}
	routeMap, err := parseRoutes(routes)
	if err != nil {
		return err
	}
	var handler slog.Handler
	switch *logFormat {
	case "text":
		handler = slog.NewTextHandler(a.stderr, nil)
	case "json":
		handler = slog.NewJSONHandler(a.stderr, nil)
	default:
		return usagef("--log-format %q: want text or json", *logFormat)
	}
	log := slog.New(handler)

	s, err := a.openMigrated(ctx, f)
	if err != nil {
		return err
	}
	defer s.Close()
	t, err := a.openTransport(ctx, *transportURL, routeMap, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := t.close(); err != nil {
			log.Warn("closing the transport", "err", a.stderr.hide(err))
		}
	}()

	// Metrics: the relay's own (issue 9's instruments and the outbox gauges), exported for
	// Prometheus through the OpenTelemetry exporter, on a registry of our own.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer meters.Shutdown(context.WithoutCancel(ctx))

	store, err := s.outbox.NewStore(s.db)
	if err != nil {
		return err
	}
	relay, err := relay.New(store, t.sender, &relay.Config{
		Name: *name, BatchSize: *batch, MaxAttempts: *attempts, Lease: *lease, Concurrency: *concurrency,
		Logger: log, MeterProvider: meters,
	})
	if err != nil {
		return usageError{err}
	}

	// Healthy from before /healthz answers until Run returns: a probe that reads the address
	// from the log must not see the relay as stopping before it started.
	var running atomic.Bool
	running.Store(true)
	var srv *http.Server
	if *listen != "" {
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return fmt.Errorf("--listen %s: %w", *listen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			switch err := s.db.PingContext(ctx); {
			case !running.Load():
				http.Error(w, "stopping", http.StatusServiceUnavailable)
			case err != nil:
				http.Error(w, "database unreachable: "+a.stderr.redact(err.Error()), http.StatusServiceUnavailable)
			default:
				fmt.Fprintln(w, "ok")
			}
		})
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("health and metrics server", "err", err)
			}
		}()
		log.Info("serving /healthz and /metrics", "addr", "http://"+ln.Addr().String())
	}

	log.Info("relay started", "outbox", s.names.Outbox, "database", s.shown, "transport", t.shown)
	err = relay.Run(ctx)
	running.Store(false)
	if srv != nil {
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = srv.Shutdown(shutdown)
		cancel()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return a.stderr.hide(err)
	}
	log.Info("relay stopped: in-flight batches finished, unsent leases released")
	return nil
}
