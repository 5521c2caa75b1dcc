package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/outbox/idempotency"
)

// httpInbox is an Inbox in memory, enough for the HTTP helper's own rules; the adapters run
// the helper on real databases through outboxtest.ExerciseIdempotency.
type httpInbox struct {
	mu        sync.Mutex
	keys      map[idempotency.Key]bool
	responses map[idempotency.Key]idempotency.Response
}

type httpTx struct {
	keys      []idempotency.Key
	responses map[idempotency.Key]idempotency.Response
}

func newHTTPInbox() *httpInbox {
	return &httpInbox{keys: map[idempotency.Key]bool{}, responses: map[idempotency.Key]idempotency.Response{}}
}

func (m *httpInbox) InTx(ctx context.Context, fn func(tx *httpTx) error) error {
	tx := &httpTx{responses: map[idempotency.Key]idempotency.Response{}}
	if err := fn(tx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range tx.keys {
		m.keys[k] = true
	}
	for k, r := range tx.responses {
		m.responses[k] = r
	}
	return nil
}

func (m *httpInbox) Record(ctx context.Context, tx *httpTx, key idempotency.Key) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys[key] {
		return false, nil
	}
	tx.keys = append(tx.keys, key)
	return true, nil
}

func (m *httpInbox) RecordMany(ctx context.Context, tx *httpTx, keys []idempotency.Key) ([]bool, error) {
	return nil, errors.New("not used")
}

func (m *httpInbox) Seen(ctx context.Context, key idempotency.Key) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.keys[key], nil
}

func (m *httpInbox) Prune(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	return 0, nil
}

func (m *httpInbox) Counts(ctx context.Context) (map[string]int64, error) { return nil, nil }

func (m *httpInbox) SaveResponse(ctx context.Context, tx *httpTx, key idempotency.Key, r idempotency.Response) error {
	tx.responses[key] = r
	return nil
}

func (m *httpInbox) Response(ctx context.Context, key idempotency.Key) (idempotency.Response, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.responses[key]
	return r, ok, nil
}

// account is the scope of the tests: the basic-auth user, as an application would take
// its authenticated account.
func account(r *http.Request) string {
	user, _, _ := r.BasicAuth()
	return user
}

// sessionHandler answers with a new order and a session cookie for its caller.
func sessionHandler(calls *int) idempotency.HTTPTxHandler[*httpTx] {
	return func(w http.ResponseWriter, r *http.Request, tx *httpTx) error {
		*calls++
		w.Header().Add("Set-Cookie", "session=for-"+account(r)+"; HttpOnly")
		w.Header().Set("Connection", "X-Trace-Hop")
		w.Header().Set("X-Trace-Hop", "1")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := fmt.Fprintf(w, `{"order":%d,"for":%q}`, *calls, account(r))
		return err
	}
}

func send(h http.Handler, user, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	req.SetBasicAuth(user, "pw")
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestHTTPHandlerNeedsAScope: without a Scope every client shared one key space, so a
// client reusing another's key (a counter, an order number) got that client's stored
// response; the helper now refuses to be built without one.
func TestHTTPHandlerNeedsAScope(t *testing.T) {
	for _, cfg := range []*idempotency.HTTPConfig{nil, {RequireKey: true}} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "Scope is required") {
					t.Errorf("HTTPHandler(%+v): recovered %v, want a panic that asks for a Scope", cfg, r)
				}
			}()
			idempotency.HTTPHandler(newHTTPInbox(), sessionHandler(new(int)), cfg)
		}()
	}
}

// TestHTTPHandlerScopesClients: two clients that send the same key and the same request
// each run the handler and each get their own response, never the other's.
func TestHTTPHandlerScopesClients(t *testing.T) {
	calls := 0
	h := idempotency.HTTPHandler(newHTTPInbox(), sessionHandler(&calls), &idempotency.HTTPConfig{Scope: account})
	alice := send(h, "alice", "order-1", `{"item":"book"}`)
	mallory := send(h, "mallory", "order-1", `{"item":"book"}`)
	if calls != 2 || strings.Contains(mallory.Body.String(), "alice") || mallory.Header().Get(idempotency.ReplayedHeader) != "" {
		t.Fatalf("mallory, reusing alice's key, got %d %q %v (handler ran %d times)", mallory.Code, mallory.Body, mallory.Header(), calls)
	}
	again := send(h, "alice", "order-1", `{"item":"book"}`)
	if calls != 2 || again.Body.String() != alice.Body.String() || again.Header().Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("alice's retry: %d %q %v", again.Code, again.Body, again.Header())
	}
}

// TestHTTPHandlerStoresNoCookies: the first response keeps every header; the stored one,
// and so every replay, leaves out Set-Cookie, credentials and hop-by-hop headers.
func TestHTTPHandlerStoresNoCookies(t *testing.T) {
	in := newHTTPInbox()
	h := idempotency.HTTPHandler(in, sessionHandler(new(int)), &idempotency.HTTPConfig{Scope: account})
	first := send(h, "alice", "k", `{}`)
	if first.Header().Get("Set-Cookie") == "" || first.Header().Get("X-Trace-Hop") == "" {
		t.Fatalf("the first response lost its headers: %v", first.Header())
	}
	stored, found, _ := in.Response(context.Background(), idempotency.RequestKey("alice", "k"))
	if !found {
		t.Fatal("no response stored")
	}
	replay := send(h, "alice", "k", `{}`)
	for _, hdr := range []http.Header{stored.Header, replay.Header()} {
		for _, name := range []string{"Set-Cookie", "Connection", "X-Trace-Hop", "Proxy-Authenticate"} {
			if v := hdr.Values(name); len(v) > 0 {
				t.Errorf("%s kept: %q (%v)", name, v, hdr)
			}
		}
		if hdr.Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type lost: %v", hdr)
		}
	}
	// A response stored by an earlier version, with its cookie, is replayed without it.
	old := idempotency.RequestKey("alice", "old")
	in.keys[old] = true
	in.responses[old] = idempotency.Response{RequestHash: stored.RequestHash, Status: 201, Header: http.Header{"Set-Cookie": {"session=x"}, "Location": {"/o/1"}}}
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
	req.SetBasicAuth("alice", "pw")
	req.Header.Set("Idempotency-Key", "old")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Header().Get("Set-Cookie") != "" || w.Header().Get("Location") != "/o/1" {
		t.Fatalf("an old stored response replayed as %d %v", w.Code, w.Header())
	}
}
