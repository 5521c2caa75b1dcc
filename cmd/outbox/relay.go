package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	outboxpglog "github.com/txoutbox/outbox/adapters/pgx/pglog"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func (a *app) relay(ctx context.Context, args []string) error {
	fs := a.flags("relay", "--transport URL [--route TYPE=DEST]... [flags] | --config FILE [flags]")
	var f dbFlags
	f.add(a, fs)
	transportURL := new(string)
	a.envFlag(fs, transportURL, "transport", "OUTBOX_TRANSPORT_URL", "the broker's `URL`: "+strings.TrimPrefix(transportHelp, "the broker, by URL:")+"\n")
	var routes stringsFlag
	fs.Var(&routes, "route", "send events of a type to their own destination: TYPE=QUEUE, TYPE=SUBJECT, TYPE=TOPIC or TYPE=ROUTING_KEY (repeat it)")
	lf := listenFlags{credentialsNamed: "OUTBOX_RELAY_TOKEN, or OUTBOX_RELAY_USER and OUTBOX_RELAY_PASSWORD"}
	lf.add(fs, "127.0.0.1:9464", "serve GET /healthz, GET /readyz and GET /metrics (Prometheus) here; \"\" for none")
	name := fs.String("name", "", "the relay's name in leases and logs (default host:pid:random)")
	batch := fs.Int("batch-size", 0, "messages per claim (default 500)")
	attempts := fs.Int("max-attempts", 0, "delivery attempts before a message is dead-lettered (default 10)")
	lease := fs.Duration("lease", 0, "how long a claim stays with this relay (default 30s)")
	concurrency := fs.Int("concurrency", 0, "claim, send and write-back loops at once (default 2)")
	logFormat := fs.String("log-format", "text", "text or json")
	var lg logFlags
	lg.add(a, fs, "read the outbox from PostgreSQL's write-ahead log instead of polling it: logical replication, a slot this relay creates, the publication of `outbox migrate --log`; other relays with --log wait as standbys (see docs/log-relay.md)")
	configPath := fs.String("config", "", "serve the outboxes of this JSON `file` in one process (see the README); SIGHUP reads it again. The database and transport flags then do not apply; --name and the relay settings are every outbox's defaults")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	if *configPath != "" && (*transportURL != "" || f.url != "" || len(routes) > 0) {
		return usagef("relay --config takes the databases and transports from the file: unset --database-url, --transport and --route (and OUTBOX_DATABASE_URL, OUTBOX_TRANSPORT_URL)")
	}
	if err := lg.check(); err != nil {
		return err
	}
	if lg.on && *configPath != "" {
		return usagef("--log relays one outbox: it does not go with --config")
	}
	if *transportURL == "" && *configPath == "" {
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
	// The listener first: an address it may not serve is refused before anything connects.
	var creds credentials
	var ln net.Listener
	var tlsConfig *tls.Config
	if lf.addr != "" {
		if creds, err = a.readCredentials("OUTBOX_RELAY"); err != nil {
			return err
		}
		if ln, tlsConfig, err = lf.listen(creds); err != nil {
			return err
		}
		defer ln.Close()
	}

	// Metrics: the relay's own (issue 9's instruments and the outbox gauges), exported for
	// Prometheus through the OpenTelemetry exporter, on a registry of our own.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer meters.Shutdown(context.WithoutCancel(ctx))
	base := relay.Config{Name: *name, BatchSize: *batch, MaxAttempts: *attempts, Lease: *lease, Concurrency: *concurrency,
		Logger: log, MeterProvider: meters}

	// serve starts the HTTP server on the listener, if there is one, with these probes (and
	// /outboxes when it is set); the returned func stops it.
	serve := func(healthz, readyz, outboxes http.HandlerFunc) (stop func()) {
		if ln == nil {
			return func() {}
		}
		srv := serveHTTP(ln, tlsConfig, relayHandler(newGuard(&lf, creds), registry, healthz, readyz, outboxes),
			&http.Server{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}, log)
		paths := "/healthz, /readyz and /metrics"
		if outboxes != nil {
			paths = "/healthz, /readyz, /outboxes and /metrics"
		}
		log.Info("serving "+paths, "addr", srv.url, "auth", creds.describe())
		return func() { _ = srv.stop(ctx) }
	}

	if *configPath != "" {
		return a.relayGroup(ctx, *configPath, base, log, func(p groupProbes) func() {
			return serve(p.healthz, p.readyz, p.outboxes)
		})
	}

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

	var store outboxdriver.Store
	if lg.on {
		store, err = a.logStore(ctx, s, f, lg, log)
	} else {
		store, err = s.outbox.NewStore(s.db)
	}
	if err != nil {
		return err
	}
	rl, err := relay.New(store, t.sender, &base)
	if err != nil {
		return usageError{err}
	}

	var done atomic.Bool // Run returned
	p := probes{state: rl.State, done: done.Load}
	stop := serve(p.healthz, p.readyz, nil)

	log.Info("relay started", "outbox", s.names.Outbox, "database", s.shown, "transport", t.shown, "mode", mode(lg.on))
	err = rl.Run(ctx)
	done.Store(true)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		return a.stderr.hide(err)
	}
	log.Info("relay stopped: in-flight batches finished, unsent leases released")
	return nil
}

// relayHandler serves the relay's probes and metrics behind g. The probes need no
// credentials (a kubelet or a load balancer asks them) and say only the state and since
// when; /metrics needs them when they are configured. Without credentials configured
// (loopback only), /metrics leaves out the event types and destinations.
//
// A relay of several outboxes (--config) serves /outboxes too: each outbox's state by name,
// behind the credentials as /metrics.
func relayHandler(g *guard, registry *prometheus.Registry, healthz, readyz, outboxes http.HandlerFunc) http.Handler {
	g.open = func(path string) bool { return path == "/healthz" || path == "/readyz" }
	full := promhttp.HandlerFor(registry, promhttp.HandlerOpts{})
	coarse := promhttp.HandlerFor(withoutLabels(registry, privateLabels...), promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", readyz)
	if outboxes != nil {
		mux.HandleFunc("GET /outboxes", outboxes)
	}
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if g.creds.enabled() {
			full.ServeHTTP(w, r)
			return
		}
		coarse.ServeHTTP(w, r)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		if _, ok := g.admit(w, r); ok {
			mux.ServeHTTP(w, r)
		}
	})
}

// probes answers /healthz and /readyz from the relay's state, never from a query of their
// own: a probe costs the database nothing, and says nothing of an error's text.
type probes struct {
	state func() relay.State
	done  func() bool // Run returned
}

// probeJSON is a probe's answer.
type probeJSON struct {
	// Status is "ok", "starting", "unavailable" (the broker or the database) or "stopped".
	Status                   string     `json:"status"`
	BrokerUnavailableSince   *time.Time `json:"broker_unavailable_since,omitempty"`
	DatabaseUnavailableSince *time.Time `json:"database_unavailable_since,omitempty"`
}

func (p probes) report() probeJSON {
	st := p.state()
	var out probeJSON
	if t := st.BrokerUnavailableSince; !t.IsZero() {
		t = t.UTC()
		out.BrokerUnavailableSince = &t
	}
	if t := st.DatabaseUnavailableSince; !t.IsZero() {
		t = t.UTC()
		out.DatabaseUnavailableSince = &t
	}
	switch {
	case p.done():
		out.Status = "stopped"
	case !st.Running:
		out.Status = "starting"
	case !st.Healthy():
		out.Status = "unavailable"
	default:
		out.Status = "ok"
	}
	return out
}

// healthz is the liveness probe: 200 while the relay runs, even while its broker or
// database is unavailable — restarting the process would not bring them back, and the
// relay resumes by itself when they are.
func (p probes) healthz(w http.ResponseWriter, r *http.Request) {
	out := p.report()
	code := http.StatusOK
	if out.Status == "stopped" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, out)
}

// readyz is the readiness probe: 200 only while the relay runs with its broker and its
// database available, 503 otherwise.
func (p probes) readyz(w http.ResponseWriter, r *http.Request) {
	out := p.report()
	code := http.StatusOK
	if out.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, out)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// logStore is the store of a relay that reads the log: over a pgx pool of its own on the
// database of s (PostgreSQL only), closed when ctx ends.
func (a *app) logStore(ctx context.Context, s *store, f dbFlags, lg logFlags, log *slog.Logger) (outboxdriver.Store, error) {
	if s.dialect != sqlstore.Postgres {
		return nil, usagef("--log needs PostgreSQL: the relay reads its write-ahead log by logical replication")
	}
	pool, err := pgxpool.New(ctx, f.url)
	if err != nil {
		return nil, a.stderr.hide(err)
	}
	context.AfterFunc(ctx, pool.Close)
	store, err := outboxpglog.NewStore(pool, &outboxpglog.Config{Tables: f.tables(), Slot: lg.slotOf(s.names),
		Publication: lg.publicationOf(s.names), Logger: log})
	if err != nil {
		pool.Close()
		return nil, usageError{err}
	}
	return store, nil
}

// mode names how a relay finds its events, for its log.
func mode(fromLog bool) string {
	if fromLog {
		return "log"
	}
	return "poll"
}
