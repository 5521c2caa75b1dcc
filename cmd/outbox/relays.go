package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/txoutbox/outbox/relay"
)

// groupFile is the configuration file of `outbox relay --config FILE`: the outboxes one
// relay process serves. JSON; unknown fields are errors.
type groupFile struct {
	// MaxCycles is relay.GroupConfig.MaxCycles (default 8). A reload does not change it.
	MaxCycles int          `json:"max_cycles"`
	Outboxes  []outboxSpec `json:"outboxes"`
}

// outboxSpec is one outbox of the file. Outboxes with the same database URL share one
// connection pool (schemas of one database); those with the same transport and routes
// share one connection to the broker.
type outboxSpec struct {
	Name string `json:"name"`
	// DatabaseURL, or DatabaseURLEnv: the name of the environment variable that holds it
	// (to keep passwords out of the file). Never printed: logs show it redacted.
	DatabaseURL    string `json:"database_url,omitempty"`
	DatabaseURLEnv string `json:"database_url_env,omitempty"`
	Schema         string `json:"schema,omitempty"`
	Table          string `json:"table,omitempty"`
	// Transport, or TransportEnv, as --transport; Routes as --route.
	Transport    string   `json:"transport,omitempty"`
	TransportEnv string   `json:"transport_env,omitempty"`
	Routes       []string `json:"routes,omitempty"`
	// The relay's settings, as the flags of the same names (0 or "": the flag's value).
	BatchSize   int    `json:"batch_size,omitempty"`
	MaxAttempts int    `json:"max_attempts,omitempty"`
	Lease       string `json:"lease,omitempty"`
	Concurrency int    `json:"concurrency,omitempty"`
	Weight      int    `json:"weight,omitempty"`
}

// resolved is an outbox of the file with its environment read: what the group runs.
type resolved struct {
	spec                  outboxSpec
	databaseURL, transURL string
	lease                 time.Duration
}

// key is what makes two versions of an outbox the same: a reload restarts an outbox whose
// key changed.
func (r resolved) key() string {
	b, _ := json.Marshal(struct {
		S    outboxSpec
		D, T string
	}{r.spec, r.databaseURL, r.transURL})
	return string(b)
}

// readGroupFile reads and checks the file at path. Its errors name the outbox and the field,
// never a URL's value.
func (a *app) readGroupFile(path string) (*groupFile, map[string]resolved, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
	if err != nil {
		return nil, nil, fmt.Errorf("--config: %w", err)
	}
	if len(raw) > 1<<20 {
		return nil, nil, fmt.Errorf("--config %s: over 1 MiB", path)
	}
	var gf groupFile
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&gf); err != nil {
		return nil, nil, fmt.Errorf("--config %s: %w", path, a.stderr.hide(err))
	}
	var errs []error
	if len(gf.Outboxes) == 0 {
		errs = append(errs, errors.New("no outboxes"))
	}
	out := map[string]resolved{}
	for i, s := range gf.Outboxes {
		where := fmt.Sprintf("outboxes[%d] %q", i, cut(s.Name, 64))
		r := resolved{spec: s}
		if _, dup := out[s.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: the name is taken by an earlier outbox", where))
		}
		pick := func(field, value, env string) string {
			switch {
			case value != "" && env != "":
				errs = append(errs, fmt.Errorf("%s: set %s or %s_env, not both", where, field, field))
			case env != "":
				if value = a.getenv(env); value == "" {
					errs = append(errs, fmt.Errorf("%s: %s_env names %s, which is not set", where, field, cut(env, 64)))
				}
			case value == "":
				errs = append(errs, fmt.Errorf("%s: no %s (or %s_env)", where, field, field))
			}
			return value
		}
		r.databaseURL = pick("database_url", s.DatabaseURL, s.DatabaseURLEnv)
		r.transURL = pick("transport", s.Transport, s.TransportEnv)
		a.stderr.addAny(r.databaseURL) // a URL's secrets never reach a log line
		a.stderr.addAny(r.transURL)
		if s.Lease != "" {
			if r.lease, err = time.ParseDuration(s.Lease); err != nil {
				errs = append(errs, fmt.Errorf("%s: lease: %v", where, err))
			}
		}
		if _, err := parseRoutes(s.Routes); err != nil {
			errs = append(errs, fmt.Errorf("%s: routes: %w", where, err))
		}
		if r.databaseURL != "" {
			if t, err := parseDatabaseURL(r.databaseURL, a.stderr); err != nil {
				errs = append(errs, fmt.Errorf("%s: database_url: %w", where, err))
			} else if _, err := outboxOn(t, dbFlags{schema: s.Schema, table: s.Table}); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
		}
		out[s.Name] = r
	}
	if len(errs) > 0 {
		return nil, nil, usageError{fmt.Errorf("--config %s: %w", path, errors.Join(errs...))}
	}
	return &gf, out, nil
}

// groupRunner runs the outboxes of a configuration file in one relay.Group and applies the
// file again on reload: it adds the new outboxes, removes those gone, restarts those
// changed, and closes the databases and transports no outbox uses any more.
type groupRunner struct {
	a     *app
	log   *slog.Logger
	g     *relay.Group
	base  relay.Config // the flags' settings
	mu    sync.Mutex
	run   map[string]resolved // by name, as running
	dbs   map[string]*sharedDB
	trans map[string]*sharedTransport
}

type sharedDB struct {
	db    *sql.DB
	t     target
	users int
}

type sharedTransport struct {
	t     *transport
	users int
}

// transportKey is what makes two outboxes share a transport: its URL and routes.
func transportKey(r resolved) string {
	return r.transURL + "\x00" + strings.Join(r.spec.Routes, "\x00")
}

// apply makes the group serve the outboxes of want. An outbox that cannot start (its
// database is unreachable, its schema not migrated) is logged and left out; the others run.
func (gr *groupRunner) apply(ctx context.Context, want map[string]resolved) (errs []error) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for name, r := range gr.run {
		if w, ok := want[name]; ok && w.key() == r.key() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := gr.g.Remove(rctx, name); err != nil && !errors.Is(err, relay.ErrUnknownOutbox) {
			gr.log.Warn("removing an outbox", "outbox", name, "err", gr.a.stderr.hide(err))
		}
		cancel()
		gr.release(r)
		delete(gr.run, name)
		gr.log.Info("outbox removed", "outbox", name)
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := gr.run[name]; ok {
			continue
		}
		if err := gr.add(ctx, want[name]); err != nil {
			errs = append(errs, fmt.Errorf("outbox %q: %w", name, err))
			gr.log.Error("outbox not started", "outbox", name, "err", gr.a.stderr.hide(err))
		}
	}
	return errs
}

// add opens (or shares) the outbox's database and transport and adds it to the group
// (gr.mu held).
func (gr *groupRunner) add(ctx context.Context, r resolved) (err error) {
	s := r.spec
	db, ok := gr.dbs[r.databaseURL]
	if !ok {
		t, err := parseDatabaseURL(r.databaseURL, gr.a.stderr)
		if err != nil {
			return err
		}
		conn, err := gr.a.connect(ctx, t, false)
		if err != nil {
			return err
		}
		db = &sharedDB{db: conn, t: t}
		gr.dbs[r.databaseURL] = db
	}
	db.users++
	tr, ok := gr.trans[transportKey(r)]
	if !ok {
		routes, _ := parseRoutes(s.Routes) // checked by readGroupFile
		t, err := gr.a.openTransport(ctx, r.transURL, routes, gr.log.With("outbox", s.Name))
		if err != nil {
			gr.releaseDB(r)
			return err
		}
		tr = &sharedTransport{t: t}
		gr.trans[transportKey(r)] = tr
	}
	tr.users++
	defer func() {
		if err != nil {
			gr.release(r)
		}
	}()
	st, err := outboxOn(db.t, dbFlags{schema: s.Schema, table: s.Table})
	if err != nil {
		return err
	}
	st.on(db.db)
	if err := st.checkSchema(ctx); err != nil {
		return err
	}
	store, err := st.outbox.NewStore(db.db)
	if err != nil {
		return err
	}
	cfg := gr.base
	set := func(p *int, v int) {
		if v != 0 {
			*p = v
		}
	}
	set(&cfg.BatchSize, s.BatchSize)
	set(&cfg.MaxAttempts, s.MaxAttempts)
	set(&cfg.Concurrency, s.Concurrency)
	if r.lease != 0 {
		cfg.Lease = r.lease
	}
	if err := gr.g.Add(relay.Outbox{Name: s.Name, Store: store, Sender: tr.t.sender, Config: &cfg, Weight: s.Weight}); err != nil {
		return usageError{err}
	}
	gr.run[s.Name] = r
	gr.log.Info("outbox added", "outbox", s.Name, "tables", st.names.Outbox, "database", db.t.shown, "transport", tr.t.shown)
	return nil
}

// release gives back r's database and transport (gr.mu held), closing those no outbox uses.
func (gr *groupRunner) release(r resolved) {
	gr.releaseDB(r)
	if tr := gr.trans[transportKey(r)]; tr != nil {
		if tr.users--; tr.users <= 0 {
			if err := tr.t.close(); err != nil {
				gr.log.Warn("closing a transport", "transport", tr.t.shown, "err", gr.a.stderr.hide(err))
			}
			delete(gr.trans, transportKey(r))
		}
	}
}

func (gr *groupRunner) releaseDB(r resolved) {
	if db := gr.dbs[r.databaseURL]; db != nil {
		if db.users--; db.users <= 0 {
			_ = db.db.Close()
			delete(gr.dbs, r.databaseURL)
		}
	}
}

// closeAll closes every database and transport, after the group stopped.
func (gr *groupRunner) closeAll() {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for _, r := range gr.run {
		gr.release(r)
	}
	gr.run = map[string]resolved{}
}

// relayGroup is `outbox relay --config FILE`: the outboxes of the file in one relay.Group,
// the file read again on SIGHUP. srv starts the HTTP server once the group exists.
func (a *app) relayGroup(ctx context.Context, path string, base relay.Config, log *slog.Logger,
	serve func(p groupProbes) (stop func())) error {
	gf, want, err := a.readGroupFile(path)
	if err != nil {
		return err
	}
	g, err := relay.NewGroup(&relay.GroupConfig{Name: base.Name, MaxCycles: gf.MaxCycles, Logger: log})
	if err != nil {
		return usageError{err}
	}
	base.Name = "" // each outbox's relay is named <group name>/<outbox>
	gr := &groupRunner{a: a, log: log, g: g, base: base, run: map[string]resolved{}, dbs: map[string]*sharedDB{}, trans: map[string]*sharedTransport{}}
	defer gr.closeAll()
	if errs := gr.apply(ctx, want); len(errs) == len(want) {
		return a.stderr.hide(fmt.Errorf("no outbox could start: %w", errors.Join(errs...)))
	}

	var ran atomic.Bool // Run returned
	p := groupProbes{g: g, done: ran.Load}
	stop := serve(p)
	log.Info("relay started", "outboxes", len(g.Names()), "config", path)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	runDone := make(chan error, 1)
	go func() { runDone <- g.Run(ctx) }()
	for {
		select {
		case <-hup:
			gf2, want, err := a.readGroupFile(path)
			if err != nil {
				log.Error("reload refused: the outboxes stay as they were", "err", a.stderr.hide(err))
				continue
			}
			if gf2.MaxCycles != gf.MaxCycles {
				log.Warn("reload: max_cycles changes only on restart", "max_cycles", gf.MaxCycles)
			}
			errs := gr.apply(ctx, want)
			log.Info("reloaded", "outboxes", len(g.Names()), "failed", len(errs))
		case err := <-runDone:
			ran.Store(true)
			stop()
			if err != nil {
				return a.stderr.hide(err)
			}
			log.Info("relay stopped: in-flight batches finished, unsent leases released")
			return nil
		}
	}
}

// groupProbes answers /healthz, /readyz and /outboxes from the group's state, never from a
// query of their own.
type groupProbes struct {
	g    *relay.Group
	done func() bool // Run returned
}

// groupProbeJSON is a probe's answer: the group's status and its outboxes counted; the
// outboxes themselves only on /outboxes, which needs the credentials when they are set.
type groupProbeJSON struct {
	// Status is "ok" (every outbox healthy), "unavailable" (at least one is not: its
	// broker or database is down, or it stopped on an unmigrated schema) or "stopped".
	Status      string                     `json:"status"`
	Outboxes    int                        `json:"outboxes"`
	Unavailable int                        `json:"unavailable"`
	Each        map[string]outboxProbeJSON `json:"each,omitempty"`
}

type outboxProbeJSON struct {
	probeJSON
	Stopped bool `json:"stopped,omitempty"`
}

func (p groupProbes) report(each bool) groupProbeJSON {
	states := p.g.States()
	out := groupProbeJSON{Outboxes: len(states)}
	if each {
		out.Each = map[string]outboxProbeJSON{}
	}
	for name, s := range states {
		if !s.Healthy() {
			out.Unavailable++
		}
		if each {
			one := probes{state: func() relay.State { return s.State }, done: p.done}.report()
			if s.Stopped != nil {
				one.Status = "stopped"
			}
			out.Each[name] = outboxProbeJSON{probeJSON: one, Stopped: s.Stopped != nil}
		}
	}
	switch {
	case p.done():
		out.Status = "stopped"
	case out.Unavailable > 0 || out.Outboxes == 0:
		out.Status = "unavailable"
	default:
		out.Status = "ok"
	}
	return out
}

// healthz: 200 while the group runs, whatever its outboxes' state (restarting the process
// would bring back no database or broker, and would stop the outboxes that work).
func (p groupProbes) healthz(w http.ResponseWriter, r *http.Request) {
	out := p.report(false)
	code := http.StatusOK
	if out.Status == "stopped" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, out)
}

// readyz: 200 only while every outbox of the group is healthy, 503 otherwise.
func (p groupProbes) readyz(w http.ResponseWriter, r *http.Request) {
	out := p.report(false)
	code := http.StatusOK
	if out.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, out)
}

// outboxes: every outbox's state, by name (as /readyz, with the names).
func (p groupProbes) outboxes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, p.report(true))
}
