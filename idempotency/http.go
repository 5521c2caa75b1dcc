package idempotency

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/txoutbox/outbox/internal/config"
)

// HTTPConfig configures [HTTPHandler]. Scope is required; other zero fields take the
// defaults below.
type HTTPConfig struct {
	// Scope returns the key space of r: the authenticated client, such as its account ID.
	// Required: two clients choosing the same key (a counter, a date, a guessable value)
	// must never get each other's stored responses, nor block each other's requests, and
	// only the application knows who its clients are. Keys of different scopes never
	// collide. A function that returns a constant makes one key space for every client:
	// only for an endpoint whose callers all trust each other. Prefer a stable identity (an
	// account) to a credential (a token that is refreshed would change the scope, and a
	// retry after the refresh would run again).
	Scope func(r *http.Request) string
	// Header is the request header that carries the key. Default "Idempotency-Key".
	Header string
	// RequireKey answers a request without the header with 400 Bad Request. By default such
	// a request runs like any other, in a transaction, without a key.
	RequireKey bool
	// MaxBodyBytes caps the request body, which is read whole to compare a retry with the
	// original: a larger body gets 413 Request Entity Too Large. Default 1 MiB.
	MaxBodyBytes int64
	// MaxKeyLength caps the key's length; a longer key gets 400 Bad Request. Default 255.
	MaxKeyLength int
	// Logger receives the errors that become a 500 response. Default slog.Default().
	Logger *slog.Logger
}

// ReplayedHeader is set to "true" on a response replayed from the table.
const ReplayedHeader = "Idempotent-Replayed"

// HTTPTxHandler handles a request inside tx, the transaction that also records its key: it
// writes its business rows and publishes its events through tx, and its response to w.
// Returning nil commits tx with the response stored under the key, whatever its status;
// returning an error rolls tx back and stores nothing, so the client can retry with the same
// key. On an error, whatever h wrote to w is sent, or 500 if it wrote nothing.
type HTTPTxHandler[TTx any] func(w http.ResponseWriter, r *http.Request, tx TTx) error

// HTTPHandler returns an http.Handler that runs h at most once per Idempotency-Key: the
// producer side of the idempotency table. The first request with a key runs h in a
// transaction that records the key and stores h's response; a retry of a request that
// committed gets the stored response again (with the header Idempotent-Replayed: true), and
// h does not run: no second row, no second event. A retry that arrives while the first
// request is still running waits for it and gets its response. A request whose h failed
// (returned an error, or its commit did) stored nothing: a retry runs h again.
//
// The key is the header's value, as a bare token or a quoted string
// (draft-ietf-httpapi-idempotency-key-header). A key reused for a different request (another
// method, URL or body) gets 422 Unprocessable Content; an empty or over-long key gets 400.
// The response is buffered whole before it is sent (h cannot stream).
//
// The stored response leaves out what is not the client's to replay: Set-Cookie (a
// session set for the first request must not be handed to whoever sends its key again),
// the headers that carry credentials, and the hop-by-hop ones; the first response keeps
// them all.
//
// HTTPHandler panics when cfg is invalid — nil, or without a Scope (which client a key
// belongs to is the application's to say, see [HTTPConfig.Scope]), or with a negative limit
// —, as a duplicate route does: it is a mistake in the code that builds the handler.
func HTTPHandler[TTx any](in Inbox[TTx], h HTTPTxHandler[TTx], cfg *HTTPConfig) http.Handler {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		panic(err)
	}
	return &httpHandler[TTx]{in: in, h: h, cfg: c}
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
// Scope has none.
func (c *HTTPConfig) WithDefaults() *HTTPConfig {
	out := HTTPConfig{}
	if c != nil {
		out = *c
	}
	out.Header = cmp.Or(out.Header, "Idempotency-Key")
	config.Default(&out.MaxBodyBytes, 1<<20)
	config.Default(&out.MaxKeyLength, 255)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *HTTPConfig) validate() error {
	var errs []error
	if c.Scope == nil {
		errs = append(errs, errors.New("Scope is required: return the authenticated client's identity (its account), "+
			"so that clients using the same Idempotency-Key never share responses"))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes %d is negative", c.MaxBodyBytes))
	}
	if c.MaxKeyLength < 0 {
		errs = append(errs, fmt.Errorf("MaxKeyLength %d is negative", c.MaxKeyLength))
	}
	if len(errs) > 0 {
		return fmt.Errorf("idempotency: invalid HTTPConfig: %w", errors.Join(errs...))
	}
	return nil
}

type httpHandler[TTx any] struct {
	in  Inbox[TTx]
	h   HTTPTxHandler[TTx]
	cfg *HTTPConfig
}

// errReplay rolls back the transaction of a request whose key was recorded before.
var errReplay = errors.New("idempotency: key recorded before")

func (s *httpHandler[TTx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	value, hasKey, err := s.key(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !hasKey && s.cfg.RequireKey {
		http.Error(w, "the "+s.cfg.Header+" header is required", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
			http.Error(w, "request body over "+strconv.FormatInt(s.cfg.MaxBodyBytes, 10)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	var key Key
	if hasKey {
		key = RequestKey(s.cfg.Scope(r), value)
	}
	hash := requestHash(r, body)
	rec := &recorder{header: http.Header{}}
	var herr error // h's own error
	err = s.in.InTx(ctx, func(tx TTx) error {
		if hasKey {
			fresh, err := s.in.Record(ctx, tx, key)
			if err != nil {
				return err
			}
			if !fresh {
				return errReplay
			}
		}
		if herr = s.h(rec, r, tx); herr != nil {
			return herr
		}
		if !hasKey {
			return nil
		}
		return s.in.SaveResponse(ctx, tx, key, Response{RequestHash: hash, Status: rec.status(), Header: replayable(rec.header), Body: rec.body.Bytes()})
	})
	switch {
	case err == nil:
		rec.send(w)
	case errors.Is(err, errReplay):
		s.replay(ctx, w, key, hash)
	case herr != nil && rec.wrote():
		rec.send(w) // h's own error response; nothing stored
	default:
		s.cfg.Logger.ErrorContext(ctx, "idempotency: request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
	}
}

// key returns the request's key, and whether it has one.
func (s *httpHandler[TTx]) key(r *http.Request) (string, bool, error) {
	vs := r.Header.Values(s.cfg.Header)
	if len(vs) == 0 {
		return "", false, nil
	}
	if len(vs) > 1 {
		return "", false, fmt.Errorf("%d %s headers; send one", len(vs), s.cfg.Header)
	}
	v := strings.TrimSpace(vs[0])
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	switch {
	case v == "":
		return "", false, fmt.Errorf("the %s header is empty", s.cfg.Header)
	case len(v) > s.cfg.MaxKeyLength:
		return "", false, fmt.Errorf("the %s header is over %d characters", s.cfg.Header, s.cfg.MaxKeyLength)
	}
	return v, true, nil
}

// replay sends the response stored under key, if the request is the one that stored it.
func (s *httpHandler[TTx]) replay(ctx context.Context, w http.ResponseWriter, key Key, hash string) {
	resp, found, err := s.in.Response(ctx, key)
	switch {
	case err != nil:
		s.cfg.Logger.ErrorContext(ctx, "idempotency: reading a stored response", "key", key.String(), "error", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	case !found:
		// The key is recorded without a response: recorded by something else than this
		// handler, or the response was pruned first.
		http.Error(w, "this "+s.cfg.Header+" was used before, and its response is no longer stored", http.StatusConflict)
		return
	case resp.RequestHash != hash:
		http.Error(w, "this "+s.cfg.Header+" was used for a different request", http.StatusUnprocessableEntity)
		return
	}
	for k, vs := range replayable(resp.Header) { // responses stored before filtering too
		w.Header()[k] = vs
	}
	w.Header().Set(ReplayedHeader, "true")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// notReplayed are the response headers a stored response leaves out: those that hand over
// a session or credentials, and the hop-by-hop ones (RFC 9110 section 7.6.1), which
// belonged to the first response's connection.
var notReplayed = []string{
	"Set-Cookie", "Set-Cookie2", "Authorization", "Proxy-Authorization", "Proxy-Authenticate",
	"Authentication-Info", "Proxy-Authentication-Info",
	"Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
}

// replayable returns h without the headers in notReplayed, nor those its Connection
// header names.
func replayable(h http.Header) http.Header {
	out := h.Clone()
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range notReplayed {
		out.Del(name)
	}
	return out
}

// requestHash identifies a request by its method, URL and body.
func requestHash(r *http.Request, body []byte) string {
	h := sha256.New()
	h.Write([]byte(r.Method + " " + r.URL.RequestURI() + "\n"))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// recorder buffers h's response until the transaction's outcome is known.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(p)
}

func (r *recorder) status() int { return cmp.Or(r.code, http.StatusOK) }

func (r *recorder) wrote() bool { return r.code != 0 || r.body.Len() > 0 }

func (r *recorder) send(w http.ResponseWriter) {
	for k, vs := range r.header {
		w.Header()[k] = vs
	}
	w.WriteHeader(r.status())
	_, _ = w.Write(r.body.Bytes())
}
