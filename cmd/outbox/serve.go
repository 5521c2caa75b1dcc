package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

//go:embed console
var consoleFiles embed.FS

func (a *app) serve(ctx context.Context, args []string) error {
	fs := a.flags("serve", "[--listen ADDR] [--allow-actions] [flags]")
	var f dbFlags
	f.add(a, fs)
	lf := listenFlags{credentialsNamed: "OUTBOX_CONSOLE_TOKEN, or OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD"}
	lf.add(fs, "127.0.0.1:8080", "the address to serve on")
	allow := fs.Bool("allow-actions", false, "allow replaying and discarding dead letters; without it the console is read-only")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	creds, err := a.readCredentials("OUTBOX_CONSOLE")
	if err != nil {
		return err
	}
	ln, tlsConfig, err := lf.listen(creds)
	if err != nil {
		return err
	}
	defer ln.Close()
	s, err := a.openMigrated(ctx, f)
	if err != nil {
		return err
	}
	defer s.Close()
	log := slog.New(slog.NewTextHandler(a.stderr, nil))
	g := newGuard(&lf, creds)
	g.realm = "outbox"
	c, err := newConsole(a, s, *allow, g, log)
	if err != nil {
		return err
	}
	// WriteTimeout bounds a download of a large body as well as a page.
	srv := serveHTTP(ln, tlsConfig, c, &http.Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Minute}, log)
	mode := "read-only"
	if *allow {
		mode = "replay and discard allowed"
	}
	log.Info("console serving", "addr", srv.url, "outbox", s.names.Outbox, "database", s.shown, "mode", mode, "auth", creds.describe())
	select {
	case err := <-srv.errc:
		return err
	case <-ctx.Done():
	}
	if err := srv.stop(ctx); err != nil {
		return err
	}
	log.Info("console stopped")
	return nil
}

// console is the web console: server-rendered pages, no JavaScript.
type console struct {
	a            *app
	s            *store
	dead         deadletter.Table
	allowActions bool
	guard        *guard
	crossOrigin  *http.CrossOriginProtection
	key          []byte // signs CSRF tokens and action notices; new in every process
	pages        map[string]*template.Template
	log          *slog.Logger
	mux          *http.ServeMux
}

const csrfCookie = "outbox_csrf"

func newConsole(a *app, s *store, allowActions bool, g *guard, log *slog.Logger) (*console, error) {
	c := &console{a: a, s: s, dead: s.deadLetters(), allowActions: allowActions, guard: g, log: log,
		crossOrigin: http.NewCrossOriginProtection(), key: make([]byte, 32), pages: map[string]*template.Template{}, mux: http.NewServeMux()}
	if _, err := rand.Read(c.key); err != nil {
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
		"cut": cut,
		// clean shows control and format characters escaped, as on the terminal; it takes
		// the string types of the deadletter package too.
		"clean": func(v any) string { return clean(fmt.Sprint(v)) },
		"bytes": func(n int64) string { return count(n) },
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
	c.mux.HandleFunc("GET /dead-letters/{id}/{part}", c.download)
	c.mux.HandleFunc("POST /dead-letters/{id}/{action}", c.act)
	c.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	c.mux.Handle("GET /static/console.css", http.StripPrefix("/static/", http.FileServerFS(static)))
	return c, nil
}

// callerKey is the context key of the authenticated caller's name.
type callerKey struct{}

// ServeHTTP adds the security headers, checks the host, the origin and the credentials,
// and refuses cross-origin writes, before any page runs.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	who, ok := c.guard.admit(w, r)
	if !ok {
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), callerKey{}, who))
	c.crossOrigin.Handler(c.mux).ServeHTTP(w, r)
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
	Entries                 []sqlstore.DeadLetterSummary
	NextPage, FirstPage     string

	Entry                       *sqlstore.DeadLetterPreview
	EventID                     string
	Headers                     []header
	Payload, RawFields, RawBody string
	// BodyCut and RawCut say the page shows the start of the body or of the raw evidence:
	// the whole is a download of its own.
	BodyCut, RawCut     bool
	CanAct, Replayable  bool
	NotReplayable, CSRF string
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
	p.Error = cleanBlock(c.a.stderr.redact(err.Error()))
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
	// Summaries: a list never reads a body, headers or raw evidence.
	if p.Entries, err = sqlstore.DeadLetterSummaries(r.Context(), c.s.dialect, c.s.q, c.s.names, flt); err != nil {
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
		c.fail(w, http.StatusNotFound, fmt.Errorf("%q is not a dead letter ID", cut(r.PathValue("id"), 40)))
		return
	}
	e, err := sqlstore.PreviewDeadLetter(r.Context(), c.s.dialect, c.s.q, c.s.names, id, previewBytes)
	switch {
	case errors.Is(err, deadletter.ErrNotFound):
		c.fail(w, http.StatusNotFound, err)
		return
	case err != nil:
		c.fail(w, http.StatusInternalServerError, err)
		return
	}
	p := c.entry(w, r, e)
	// A notice only for an action this process did, for this browser, and that the entry
	// shows: a link with ?done=replay alone proves nothing.
	q := r.URL.Query()
	switch done := q.Get("done"); {
	case !c.validNotice(r, id, done, q.Get("sig")):
	case done == "replay" && e.Status == deadletter.StatusReplayed:
		p.Flash = "Replayed: the event is back in the outbox, and the relay delivers it again with the same ID."
	case done == "discard" && e.Status == deadletter.StatusDiscarded:
		p.Flash = "Discarded: the entry is kept for audit."
	}
	c.render(w, http.StatusOK, "entry", p)
}

// entry fills the detail page of e, with a CSRF token when actions are allowed.
func (c *console) entry(w http.ResponseWriter, r *http.Request, e sqlstore.DeadLetterPreview) *page {
	p := c.newPage(fmt.Sprintf("Dead letter %d", e.ID), "entry")
	p.Entry = &e
	if e.Message.ID != uuid.Nil {
		p.EventID = e.Message.ID.String()
	}
	for _, k := range slices.Sorted(maps.Keys(e.Message.Headers)) {
		p.Headers = append(p.Headers, header{clean(k), clean(e.Message.Headers[k])})
	}
	p.BodyCut = e.BodyBytes > int64(len(e.Message.Body))
	p.Payload = payloadText(e.Message.Body)
	if e.Raw != nil {
		fields := *e.Raw
		fields.Body = nil
		head, _ := fields.MarshalText()
		p.RawFields = cleanBlock(strings.TrimSuffix(string(head), "\n"))
		if len(e.Raw.Body) > 0 {
			p.RawBody = rawBytes(e.Raw.Body)
		}
		p.RawCut = e.RawCut
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

// download sends an entry's body ("body") or its raw evidence ("raw") whole, a chunk at a
// time: the console never holds more than one chunk of it.
func (c *console) download(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	part := r.PathValue("part")
	if err != nil || id <= 0 || part != "body" && part != "raw" {
		c.fail(w, http.StatusNotFound, errors.New("no such page"))
		return
	}
	found, err := c.s.copyBytes(r.Context(), w, id, part, func(total int64) {
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.FormatInt(total, 10))
		h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="dead-letter-%d-%s.bin"`, id, part))
	})
	switch {
	case err != nil && !found:
		c.fail(w, http.StatusInternalServerError, err)
	case err != nil:
		c.log.Warn("a download stopped", "id", id, "part", part, "err", c.a.stderr.hide(err))
	case !found:
		c.fail(w, http.StatusNotFound, fmt.Errorf("dead letter %d has no %s", id, map[string]string{"body": "body", "raw": "raw evidence"}[part]))
	}
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
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	}
	return c.sign("csrf", value)
}

// sign is an HMAC of parts under the process's key.
func (c *console) sign(parts ...string) string {
	m := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// validCSRF checks the form's token against the request's cookie.
func (c *console) validCSRF(r *http.Request) bool {
	cookie, err := r.Cookie(csrfCookie)
	if err != nil || cookie.Value == "" {
		return false
	}
	return hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(c.sign("csrf", cookie.Value)))
}

// notice signs the redirect after an action: it names the action, the entry and the
// browser (its CSRF cookie).
func (c *console) notice(r *http.Request, id int64, action string) string {
	cookie, _ := r.Cookie(csrfCookie)
	return c.sign("done", action, strconv.FormatInt(id, 10), cookie.Value)
}

func (c *console) validNotice(r *http.Request, id int64, action, sig string) bool {
	if action == "" || sig == "" {
		return false
	}
	if cookie, err := r.Cookie(csrfCookie); err != nil || cookie.Value == "" {
		return false
	}
	return hmac.Equal([]byte(sig), []byte(c.notice(r, id, action)))
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
		c.fail(w, http.StatusNotFound, fmt.Errorf("%q is not a dead letter ID", cut(r.PathValue("id"), 40)))
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
		c.fail(w, http.StatusNotFound, fmt.Errorf("no action %q", cut(action, 40)))
		return
	}
	err = do(r.Context(), id)
	// The audit names who the credentials say, never what a request merely claims (a
	// basic-auth header sent to a console without credentials proves nothing).
	who := r.RemoteAddr
	if caller, _ := r.Context().Value(callerKey{}).(string); caller != "" {
		who = caller + " from " + who
	}
	switch {
	case err == nil:
		c.log.Info("dead letter "+action+"ed", "id", id, "by", who)
		http.Redirect(w, r, fmt.Sprintf("/dead-letters/%d?done=%s&sig=%s", id, action, c.notice(r, id, action)), http.StatusSeeOther)
	case errors.Is(err, deadletter.ErrNotFound):
		c.fail(w, http.StatusNotFound, err)
	case errors.Is(err, deadletter.ErrNotPending), errors.Is(err, deadletter.ErrNotReplayable):
		e, gerr := sqlstore.PreviewDeadLetter(r.Context(), c.s.dialect, c.s.q, c.s.names, id, previewBytes)
		if gerr != nil {
			c.fail(w, http.StatusConflict, err)
			return
		}
		p := c.entry(w, r, e)
		p.Error = cleanBlock(c.a.stderr.redact(err.Error()))
		c.render(w, http.StatusConflict, "entry", p)
	default:
		c.fail(w, http.StatusInternalServerError, err)
	}
}
