package outboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/idempotency"
)

// exerciseHTTP runs the cases of the HTTP Idempotency-Key helper: a handler that, in the
// request's transaction, writes an effect row, publishes an event and answers 201 with a
// new order ID, so that identical response bodies prove a replay.
func exerciseHTTP[TTx any](t *testing.T, newFixture func(t *testing.T) *IdempotencyFixture[TTx]) {
	// Concurrent duplicates of one request: one effect, one event, and every client gets
	// the same response, all but one of them replayed.
	t.Run("ConcurrentDuplicatesOneEffect", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		const clients = 8
		entered := make(chan struct{}, clients)
		release := make(chan struct{})
		srv := f.IdempotentHTTP(orderHandler(f, func() error {
			entered <- struct{}{}
			<-release // the first request holds its transaction while the others arrive
			return nil
		}), oneScope())
		var wg sync.WaitGroup
		responses := make([]*httptest.ResponseRecorder, clients)
		for i := range responses {
			wg.Go(func() { responses[i] = post(srv, "key-1", `{"text":"order"}`) })
		}
		select {
		case <-entered:
		case <-time.After(time.Minute):
			t.Fatal("no request reached the handler")
		}
		close(release)
		wg.Wait()
		replayed := 0
		for i, r := range responses {
			if r.Code != http.StatusCreated || r.Body.String() != responses[0].Body.String() || r.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("response %d: %d %q %v; want 201 and the body %q", i, r.Code, r.Body, r.Header(), responses[0].Body)
			}
			if r.Header().Get(idempotency.ReplayedHeader) == "true" {
				replayed++
			}
		}
		if replayed != clients-1 {
			t.Fatalf("%d responses replayed, want %d", replayed, clients-1)
		}
		if len(entered) != 0 {
			t.Fatalf("the handler ran %d more times", len(entered))
		}
		expectEffects(t, f, map[string]int{"order": 1})
		expectEvents(t, f, 1)
	})

	// A request whose handler failed stored nothing: its retry runs the handler again and
	// commits once; a retry of that one is a replay.
	t.Run("FailedRequestCanBeRetried", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		var calls atomic.Int32
		srv := f.IdempotentHTTP(orderHandler(f, func() error {
			if calls.Add(1) == 1 {
				return errors.New("payment provider timed out")
			}
			return nil
		}), oneScope())
		if r := post(srv, "key-2", `{"text":"retried"}`); r.Code != http.StatusInternalServerError || strings.Contains(r.Body.String(), "payment") {
			t.Fatalf("failed request: %d %q; want a bare 500", r.Code, r.Body)
		}
		expectEffects(t, f, map[string]int{})
		expectEvents(t, f, 0)
		first := post(srv, "key-2", `{"text":"retried"}`)
		if first.Code != http.StatusCreated || first.Header().Get(idempotency.ReplayedHeader) != "" {
			t.Fatalf("retry: %d %v", first.Code, first.Header())
		}
		again := post(srv, "key-2", `{"text":"retried"}`)
		if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() || again.Header().Get(idempotency.ReplayedHeader) != "true" {
			t.Fatalf("retry of a committed request: %d %q, want the stored %q", again.Code, again.Body, first.Body)
		}
		if calls.Load() != 2 {
			t.Fatalf("the handler ran %d times, want 2", calls.Load())
		}
		expectEffects(t, f, map[string]int{"retried": 1})
		expectEvents(t, f, 1)
	})

	// A key reused for another request is refused; a key is per scope; without a key the
	// request runs every time, unless a key is required; a malformed key is refused.
	t.Run("KeysAndScopes", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		scoped := f.IdempotentHTTP(orderHandler(f, nil), &idempotency.HTTPConfig{
			Scope: func(r *http.Request) string { return r.Header.Get("Account") },
		})
		send := func(key, account, body string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			req.Header.Set("Account", account)
			w := httptest.NewRecorder()
			scoped.ServeHTTP(w, req)
			return w
		}
		if r := send(`"k"`, "acme", `{"text":"a"}`); r.Code != http.StatusCreated {
			t.Fatalf("first request: %d %q", r.Code, r.Body)
		}
		if r := send("k", "acme", `{"text":"b"}`); r.Code != http.StatusUnprocessableEntity {
			t.Fatalf("the same key (quoted, then bare) for another body: %d %q, want 422", r.Code, r.Body)
		}
		if r := send("k", "globex", `{"text":"b"}`); r.Code != http.StatusCreated {
			t.Fatalf("the same key in another scope: %d %q, want 201", r.Code, r.Body)
		}
		for range 2 {
			if r := send("", "acme", `{"text":"nokey"}`); r.Code != http.StatusCreated {
				t.Fatalf("a request without a key: %d %q", r.Code, r.Body)
			}
		}
		if r := send(strings.Repeat("x", 256), "acme", `{"text":"c"}`); r.Code != http.StatusBadRequest {
			t.Fatalf("an over-long key: %d, want 400", r.Code)
		}
		required := f.IdempotentHTTP(orderHandler(f, nil), &idempotency.HTTPConfig{RequireKey: true, Scope: oneScope().Scope})
		w := httptest.NewRecorder()
		required.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"text":"d"}`)))
		if w.Code != http.StatusBadRequest {
			t.Fatalf("RequireKey without a key: %d, want 400", w.Code)
		}
		expectEffects(t, f, map[string]int{"a": 1, "b": 1, "nokey": 2})
		counts, err := f.Inbox.Counts(context.Background())
		if err != nil || counts["http:acme"] != 1 || counts["http:globex"] != 1 {
			t.Fatalf("inbox counts %v (%v), want one key in each scope", counts, err)
		}
	})

	// A replay hands over the stored status, body and headers, but not a cookie set for the
	// first request (its session), credentials, or the first connection's hop-by-hop
	// headers; the first response had them all.
	t.Run("ReplayLeavesOutCookiesAndCredentials", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		orders := orderHandler(f, nil)
		srv := f.IdempotentHTTP(func(w http.ResponseWriter, r *http.Request, tx TTx) error {
			h := w.Header()
			h.Add("Set-Cookie", "session=s3cret-session; HttpOnly")
			h.Set("Authentication-Info", `nextnonce="s3cret"`)
			h.Set("Connection", "X-Hop")
			h.Set("X-Hop", "first connection only")
			h.Set("Location", "/orders/1")
			return orders(w, r, tx)
		}, oneScope())
		first := post(srv, "key-4", `{"text":"cookie"}`)
		if first.Code != http.StatusCreated || first.Header().Get("Set-Cookie") == "" {
			t.Fatalf("first response: %d %v", first.Code, first.Header())
		}
		again := post(srv, "key-4", `{"text":"cookie"}`)
		if again.Code != http.StatusCreated || again.Header().Get(idempotency.ReplayedHeader) != "true" || again.Header().Get("Location") != "/orders/1" {
			t.Fatalf("replay: %d %v", again.Code, again.Header())
		}
		for _, h := range []string{"Set-Cookie", "Authentication-Info", "Connection", "X-Hop"} {
			if v := again.Header().Values(h); len(v) > 0 {
				t.Errorf("the replay has %s: %q", h, v)
			}
		}
		stored, found, err := f.Inbox.Response(context.Background(), idempotency.RequestKey("", "key-4"))
		if err != nil || !found || stored.Header.Get("Set-Cookie") != "" || stored.Header.Get("Location") == "" {
			t.Fatalf("the stored response: %v %v, %v", stored.Header, found, err)
		}
	})

	// Stored responses are pruned with the inbox: after that, the key is free again.
	t.Run("PrunedWithTheInbox", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		srv := f.IdempotentHTTP(orderHandler(f, nil), oneScope())
		if r := post(srv, "key-3", `{"text":"old"}`); r.Code != http.StatusCreated {
			t.Fatalf("%d %q", r.Code, r.Body)
		}
		if err := f.AgeInbox(context.Background(), 48*time.Hour); err != nil {
			t.Fatal(err)
		}
		if n, err := f.PruneInbox(context.Background(), 24*time.Hour, 100); err != nil || n != 1 {
			t.Fatalf("prune: %d, %v", n, err)
		}
		if _, found, err := f.Inbox.Response(context.Background(), idempotency.RequestKey("", "key-3")); err != nil || found {
			t.Fatalf("the response outlived its key: %v, %v", found, err)
		}
		if r := post(srv, "key-3", `{"text":"old"}`); r.Code != http.StatusCreated || r.Header().Get(idempotency.ReplayedHeader) != "" {
			t.Fatalf("after pruning: %d %v, want a new 201", r.Code, r.Header())
		}
		expectEffects(t, f, map[string]int{"old": 2})
	})
}

// orderHandler is an HTTP handler that, in tx, writes an effect row for the request body's
// text, publishes an event, runs hook (if any; its error fails the request) and answers 201
// with a new order ID.
func orderHandler[TTx any](f *IdempotencyFixture[TTx], hook func() error) idempotency.HTTPTxHandler[TTx] {
	return func(w http.ResponseWriter, r *http.Request, tx TTx) error {
		var in Note
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(body, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return err
		}
		id := uuid.NewString()
		ctx := r.Context()
		if err := f.Effect(ctx, tx, id, in.Text); err != nil {
			return err
		}
		if err := f.Publish(ctx, tx, outbox.New(in, outbox.WithKey(id))); err != nil {
			return err
		}
		if hook != nil {
			if err := hook(); err != nil {
				return err
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err = fmt.Fprintf(w, `{"order_id":%q}`, id)
		return err
	}
}

// oneScope is a configuration with one key space, for the tests whose clients are one.
func oneScope() *idempotency.HTTPConfig {
	return &idempotency.HTTPConfig{Scope: func(*http.Request) string { return "" }}
}

// post sends a POST /orders with an Idempotency-Key.
func post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body)).WithContext(context.Background())
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func expectEvents[TTx any](t *testing.T, f *IdempotencyFixture[TTx], want int) {
	t.Helper()
	n, err := f.Pending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("%d events in the outbox, want %d", n, want)
	}
}
