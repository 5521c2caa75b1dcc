package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox/deadletter"
)

//go:embed console
var consoleFiles embed.FS

func (a *app) serve(ctx context.Context, args []string) error {
	fs := a.flags("serve", "[--listen ADDR] [--allow-actions] [flags]")
	var f dbFlags
	f.add(a, fs)
	listen := fs.String("listen", "127.0.0.1:8080", "the address to serve on; loopback by default. Any other needs OUTBOX_CONSOLE_TOKEN or OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD")
	allow := fs.Bool("allow-actions", false, "allow replaying and discarding dead letters; without it the console is read-only")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	auth := consoleAuth{token: a.getenv("OUTBOX_CONSOLE_TOKEN"), user: a.getenv("OUTBOX_CONSOLE_USER"), password: a.getenv("OUTBOX_CONSOLE_PASSWORD")}
	if (auth.user == "") != (auth.password == "") {
		return usagef("set both OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD, or neither")
	}
	a.stderr.add(auth.token, auth.password)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return usagef("--listen %s: %v", *listen, err)
	}
	defer ln.Close()
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() && !auth.enabled() {
		return usagef("--listen %s is not a loopback address: set OUTBOX_CONSOLE_TOKEN (bearer) or OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD (basic auth) first", *listen)
	}
	s, err := a.openMigrated(ctx, f)
	if err != nil {
		return err
	}
	defer s.Close()
	log := slog.New(slog.NewTextHandler(a.stderr, nil))
	c, err := newConsole(a, s, *allow, auth, log)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute}
	mode := "read-only"
	if *allow {
		mode = "replay and discard allowed"
	}
	log.Info("console serving", "addr", "http://"+ln.Addr().String(), "outbox", s.names.Outbox, "database", s.shown, "mode", mode, "auth", auth.describe())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	log.Info("console stopped")
	return nil
}

// consoleAuth is the console's optional authentication, from the environment.
type consoleAuth struct{ token, user, password string }

func (c consoleAuth) enabled() bool { return c.token != "" || c.user != "" }

func (c consoleAuth) describe() string {
	switch {
	case c.token != "" && c.user != "":
		return "bearer token or basic"
	case c.token != "":
		return "bearer token"
	case c.user != "":
		return "basic"
	}
	return "none (loopback only)"
}

// allows reports whether r carries the configured credentials, compared in constant time.
func (c consoleAuth) allows(r *http.Request) bool {
	if !c.enabled() {
		return true
	}
	if c.token != "" {
		if got, ok := cutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(got, c.token) {
			return true
		}
	}
	if c.user != "" {
		if u, p, ok := r.BasicAuth(); ok && equal(u, c.user) && equal(p, c.password) {
			return true
		}
	}
	return false
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false
	}
	return s[len(prefix):], true
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// console is the web console: server-rendered pages, no JavaScript.
type console struct {
	a            *app
	s            *store
	dead         deadletter.Table
	allowActions bool
	auth         consoleAuth
	csrfKey      []byte
	pages        map[string]*template.Template
	log          *slog.Logger
	mux          *http.ServeMux
}

const csrfCookie = "outbox_csrf"

func newConsole(a *app, s *store, allowActions bool, auth consoleAuth, log *slog.Logger) (*console, error) {
	c := &console{a: a, s: s, dead: s.deadLetters(), allowActions: allowActions, auth: auth, log: log,
		csrfKey: make([]byte, 32), pages: map[string]*template.Template{}, mux: http.NewServeMux()}
	if _, err := rand.Read(c.csrfKey); err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"stamp": func(v any) string {
			switch t := v.(type) {
			case time.Time:
				return stamp(t)
			case *time.Time:
				if t != nil {
					return stamp(*t)
				}
			}
			return "-"
		},
		"cut":   cut,
		"clean": clean, // control characters shown escaped, as on the terminal
	}
	for _, name := range []string{"status", "list", "entry", "message"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(consoleFiles, "console/layout.html", "console/"+name+".html")
		if err != nil {
			return nil, err
		}
		c.pages[name] = t
	}
	static, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		return nil, err
	}
	c.mux.HandleFunc("GET /{$}", c.statusPage)
	c.mux.HandleFunc("GET /dead-letters", c.listPage)
	c.mux.HandleFunc("GET /dead-letters/{id}", c.entryPage)
	c.mux.HandleFunc("POST /dead-letters/{id}/{action}", c.act)
	c.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	c.mux.Handle("GET /static/console.css", http.StripPrefix("/static/", http.FileServerFS(static)))
	return c, nil
}

// ServeHTTP adds the security headers, checks credentials and refuses cross-origin writes
// before any page runs.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if !c.auth.allows(r) {
		if c.auth.user != "" {
			h.Set("WWW-Authenticate", `Basic realm="outbox", charset="UTF-8"`)
		}
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	http.NewCrossOriginProtection().Handler(c.mux).ServeHTTP(w, r)
}

// page is what every template gets.
type page struct {
	Title, Page, Outbox, Database string
	AllowActions                  bool
	Flash, Error                  string

	Report *report
	Lag    string
	Chart  *chart

	Filter                  filterForm
	Stages, Kinds, Statuses []string
	Entries                 []deadletter.Entry
	NextPage, FirstPage     string

	Entry                       *deadletter.Entry
	EventID                     string
	Headers                     []header
	Payload, RawFields, RawBody string
	CanAct, Replayable          bool
	NotReplayable, CSRF         string
}

type header struct{ Name, Value string }

func (c *console) newPage(title, name string) *page {
	return &page{Title: title, Page: name, Outbox: c.s.names.Outbox, Database: c.s.shown, AllowActions: c.allowActions}
}

// render writes a page; a template error is logged and answered with a plain 500.
func (c *console) render(w http.ResponseWriter, status int, name string, p *page) {
	var b bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&b, "layout", p); err != nil {
		c.log.Error("rendering a page", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail answers a page whose data could not be read: the error, redacted, on the page.
func (c *console) fail(w http.ResponseWriter, status int, err error) {
	p := c.newPage(http.StatusText(status), "message")
	p.Error = c.a.stderr.redact(err.Error())
	c.render(w, status, "message", p)
}

func (c *console) statusPage(w http.ResponseWriter, r *http.Request) {
	p := c.newPage("Status", "status")
	rep, err := c.s.readReport(r.Context())
	if rep == nil || err != nil {
		if err == nil {
			err = errors.New("no report")
		}
		c.fail(w, http.StatusInternalServerError, err)
		return
	}
	p.Report = rep
	p.Lag = "0s"
	if rep.Backlog.OldestAgeSeconds != nil {
		p.Lag = age(time.Duration(*rep.Backlog.OldestAgeSeconds * float64(time.Second)))
	}
	span := r.URL.Query().Get("range")
	if p.Chart, err = c.history(r.Context(), span, rep.Now); err != nil {
		c.fail(w, http.StatusInternalServerError, err)
		return
	}
	c.render(w, http.StatusOK, "status", p)
}

// filterForm is the list page's filter, as the form holds it.
type filterForm struct {
	Type, Stage, Kind, Consumer, Reason, Since, Until, Status, EventID, BrokerID string
	After                                                                        int64
	Limit                                                                        int
}

func (f filterForm) flags() filterFlags {
	return filterFlags{eventType: f.Type, stage: f.Stage, kind: f.Kind, consumer: f.Consumer, reason: f.Reason,
		since: f.Since, until: f.Until, status: f.Status, eventID: f.EventID, brokerID: f.BrokerID}
}

// query is the list URL of f, starting after after.
func (f filterForm) query(after int64) string {
	q := url.Values{}
	for k, v := range map[string]string{"type": f.Type, "stage": f.Stage, "kind": f.Kind, "consumer": f.Consumer, "reason": f.Reason,
		"since": f.Since, "until": f.Until, "status": f.Status, "event_id": f.EventID, "broker_message_id": f.BrokerID} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if f.Limit != 50 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return "/dead-letters?" + q.Encode()
}

func (c *console) listPage(w http.ResponseWriter, r *http.Request) {
	p := c.newPage("Dead letters", "list")
	q := r.URL.Query()
	ff := filterForm{Type: q.Get("type"), Stage: q.Get("stage"), Kind: q.Get("kind"), Consumer: q.Get("consumer"),
		Reason: q.Get("reason"), Since: q.Get("since"), Until: q.Get("until"), Status: q.Get("status"),
		EventID: q.Get("event_id"), BrokerID: q.Get("broker_message_id"), Limit: 50}
	if ff.Status == "" {
		ff.Status = "pending"
	}
	p.Filter = ff
	p.Stages = []string{"", "relay", "consumer"}
	p.Kinds = []string{""}
	for _, k := range kinds {
		p.Kinds = append(p.Kinds, string(k))
	}
	p.Statuses = []string{"pending", "replayed", "discarded", "all"}
	var errs []error
	if v := q.Get("after"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("after %q is not an ID", v))
		} else {
			p.Filter.After = n
		}
	}
	if v := q.Get("limit"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n < 1 || n > 500 {
			errs = append(errs, fmt.Errorf("limit %q is outside 1..500", v))
		} else {
			p.Filter.Limit = n
		}
	}
	flags := ff.flags()
	flt, err := flags.filter(time.Now())
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		p.Error = errors.Join(errs...).Error()
		c.render(w, http.StatusBadRequest, "list", p)
		return
	}
	flt.AfterID, flt.Limit = p.Filter.After, p.Filter.Limit
	if p.Entries, err = c.dead.List(r.Context(), flt); err != nil {
		c.fail(w, http.StatusInternalServerError, err)
		return
	}
	if len(p.Entries) == p.Filter.Limit {
		p.NextPage = p.Filter.query(p.Entries[len(p.Entries)-1].ID)
	}
	p.FirstPage = p.Filter.query(0)
	c.render(w, http.StatusOK, "list", p)
}

func (c *console) entryPage(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, http.StatusNotFound, fmt.Errorf("%q is not a dead letter ID", r.PathValue("id")))
		return
	}
	e, err := c.dead.Get(r.Context(), id)
	switch {
	case errors.Is(err, deadletter.ErrNotFound):
		c.fail(w, http.StatusNotFound, err)
		return
	case err != nil:
		c.fail(w, http.StatusInternalServerError, err)
		return
	}
	p := c.entry(w, r, e)
	switch r.URL.Query().Get("done") {
	case "replay":
		p.Flash = "Replayed: the event is back in the outbox, and the relay delivers it again with the same ID."
	case "discard":
		p.Flash = "Discarded: the entry is kept for audit."
	}
	c.render(w, http.StatusOK, "entry", p)
}

// entry fills the detail page of e, with a CSRF token when actions are allowed.
func (c *console) entry(w http.ResponseWriter, r *http.Request, e deadletter.Entry) *page {
	p := c.newPage(fmt.Sprintf("Dead letter %d", e.ID), "entry")
	p.Entry = &e
	if e.Message.ID != uuid.Nil {
		p.EventID = e.Message.ID.String()
	}
	for _, k := range slices.Sorted(maps.Keys(e.Message.Headers)) {
		p.Headers = append(p.Headers, header{k, e.Message.Headers[k]})
	}
	p.Payload = payloadText(e.Message.Body)
	if e.Raw != nil {
		raw, _ := e.Raw.MarshalText()
		head, _, _ := bytes.Cut(raw, []byte("\n\n"))
		p.RawFields = string(head)
		if len(e.Raw.Body) > 0 {
			p.RawBody = rawBytes(e.Raw.Body)
		}
	}
	p.CanAct = c.allowActions && e.Status == deadletter.StatusPending
	p.Replayable = e.Kind != deadletter.KindMalformed && e.Kind != deadletter.KindUnreadableRow && e.Message.ID != uuid.Nil
	if !p.Replayable {
		p.NotReplayable = "This entry cannot be replayed: its event was never read in full. Its raw evidence is below."
	}
	if p.CanAct {
		p.CSRF = c.csrfToken(w, r)
	}
	return p
}

// csrfToken returns the form token of the browser's CSRF cookie, setting a new cookie
// first if it has none: the token is an HMAC of the cookie under a key of this process, so
// a page of another site can neither read nor forge it.
func (c *console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	cookie, err := r.Cookie(csrfCookie)
	value := ""
	if err == nil && len(cookie.Value) == 64 {
		value = cookie.Value
	} else {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		value = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	return c.sign(value)
}

func (c *console) sign(value string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte(value))
	return hex.EncodeToString(m.Sum(nil))
}

// validCSRF checks the form's token against the request's cookie.
func (c *console) validCSRF(r *http.Request) bool {
	cookie, err := r.Cookie(csrfCookie)
	if err != nil || cookie.Value == "" {
		return false
	}
	return hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(c.sign(cookie.Value)))
}

// act replays or discards one entry, then redirects to it (post/redirect/get).
func (c *console) act(w http.ResponseWriter, r *http.Request) {
	if !c.allowActions {
		c.fail(w, http.StatusForbidden, errors.New("this console is read-only: start outbox serve with --allow-actions to replay or discard"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if !c.validCSRF(r) {
		c.fail(w, http.StatusForbidden, errors.New("missing or invalid CSRF token: reload the page and try again"))
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, http.StatusNotFound, fmt.Errorf("%q is not a dead letter ID", r.PathValue("id")))
		return
	}
	action := r.PathValue("action")
	var do func(context.Context, int64) error
	switch action {
	case "replay":
		do = c.dead.Replay
	case "discard":
		do = c.dead.Discard
	default:
		c.fail(w, http.StatusNotFound, fmt.Errorf("no action %q", action))
		return
	}
	err = do(r.Context(), id)
	who := r.RemoteAddr
	if u, _, ok := r.BasicAuth(); ok {
		who = u + " from " + who
	}
	switch {
	case err == nil:
		c.log.Info("dead letter "+action+"ed", "id", id, "by", who)
		http.Redirect(w, r, fmt.Sprintf("/dead-letters/%d?done=%s", id, action), http.StatusSeeOther)
	case errors.Is(err, deadletter.ErrNotFound):
		c.fail(w, http.StatusNotFound, err)
	case errors.Is(err, deadletter.ErrNotPending), errors.Is(err, deadletter.ErrNotReplayable):
		e, gerr := c.dead.Get(r.Context(), id)
		if gerr != nil {
			c.fail(w, http.StatusConflict, err)
			return
		}
		p := c.entry(w, r, e)
		p.Error = c.a.stderr.redact(err.Error())
		c.render(w, http.StatusConflict, "entry", p)
	default:
		c.fail(w, http.StatusInternalServerError, err)
	}
}
