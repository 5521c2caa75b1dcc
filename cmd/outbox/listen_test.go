package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
)

// The tests of docs/security.md about who reaches the console and the relay, one (or more) per
// finding of issue 23; security_test.go has those about what they print.

// request sends method target with body (form-encoded when not empty) and extra headers
// (a "Host" one sets the request's host), with client (nil: the default), and returns the
// status and the body.
func request(t *testing.T, client *http.Client, method, target, body string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if h := header.Get("Host"); h != "" {
		req.Host = h
	}
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestListenersRefuseOtherHosts: a page under another host name (DNS rebinding: the name
// resolves to 127.0.0.1 once the page is loaded) reads neither the console nor the relay's
// endpoints; an origin of another host, and another site's subresource requests, are
// refused too. IP addresses, localhost and --allowed-host names are served.
func TestListenersRefuseOtherHosts(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	seedDeadLetters(t, tb)
	console := startConsole(t, tb, nil, "--allow-actions", "--allowed-host", "Console.Example.COM")
	d := startDaemon(t, nil, append(append([]string{"relay"}, tb.flags...), "--transport", "memory://", "--listen", "127.0.0.1:0")...)
	relay := "http://" + d.addr(t)
	port := func(base string) string { u, _ := url.Parse(base); return u.Port() }
	for _, c := range []struct {
		base, path string
		host       string
		header     http.Header
		want       int
	}{
		{console, "/dead-letters?status=all", "attacker.example:" + port(console), nil, http.StatusMisdirectedRequest},
		{console, "/dead-letters?status=all", "attacker.example", nil, http.StatusMisdirectedRequest},
		{console, "/", "localhost.attacker.example:" + port(console), nil, http.StatusMisdirectedRequest},
		{relay, "/metrics", "attacker.example:" + port(relay), nil, http.StatusMisdirectedRequest},
		{relay, "/healthz", "attacker.example:" + port(relay), nil, http.StatusMisdirectedRequest},
		{console, "/dead-letters?status=all", "localhost:" + port(console), nil, http.StatusOK},
		{console, "/dead-letters?status=all", "console.example.com", nil, http.StatusOK},
		{console, "/", "[::1]:" + port(console), nil, http.StatusOK},
		{relay, "/metrics", "localhost:" + port(relay), nil, http.StatusOK},
		// An origin of another host (a page's fetch, a form), whatever its Host says.
		{console, "/dead-letters", "", http.Header{"Origin": {"http://attacker.example"}}, http.StatusForbidden},
		{relay, "/metrics", "", http.Header{"Origin": {"http://attacker.example:" + port(relay)}}, http.StatusForbidden},
		// Another site's page may link to the console, not load from it (an <img> costs
		// the console the page's work); another port of localhost is another site's page.
		{console, "/dead-letters?status=all&limit=500", "", http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"no-cors"}, "Sec-Fetch-Dest": {"image"}}, http.StatusForbidden},
		{console, "/dead-letters", "", http.Header{"Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"cors"}}, http.StatusForbidden},
		{relay, "/metrics", "", http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"no-cors"}}, http.StatusForbidden},
		{console, "/dead-letters", "", http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"document"}}, http.StatusOK},
	} {
		h := c.header.Clone()
		if h == nil {
			h = http.Header{}
		}
		if c.host != "" {
			h.Set("Host", c.host)
		}
		code, body := request(t, nil, http.MethodGet, c.base+c.path, "", h)
		if code != c.want {
			t.Errorf("GET %s (Host %q, %v): %d, want %d\n%s", c.path, c.host, c.header, code, c.want, cut(body, 300))
		}
		if code != http.StatusOK && (strings.Contains(body, "payment service") || strings.Contains(body, "txoutbox_")) {
			t.Errorf("a refused request read the data:\n%s", cut(body, 300))
		}
	}
}

// TestConsoleRebindingInBrowser: in Chromium, a page served under another name
// (attacker.example, mapped to 127.0.0.1 as a rebinding DNS server would) runs a script
// that fetches the console's dead letters from its own origin: it reads nothing. The same
// script under 127.0.0.1 reads them, so the test would see a leak.
func TestConsoleRebindingInBrowser(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	seedDeadLetters(t, tb)
	base := startConsole(t, tb, nil, "--allow-actions") // loopback, no credentials: what rebinding targets
	u, _ := url.Parse(base)
	ctx := browseAs(t, false, chromedp.Flag("host-resolver-rules", "MAP attacker.example 127.0.0.1"))
	read := func(origin string) string {
		t.Helper()
		var out string
		err := chromedp.Run(ctx,
			cdppage.SetBypassCSP(true), // the attacker's page is its own, without the console's CSP
			chromedp.Navigate(origin+"/static/console.css"),
			chromedp.Evaluate(`(async () => {
				try {
					const list = await fetch("/dead-letters?status=all");
					const page = await list.text();
					const entry = await fetch((page.match(/href="(\/dead-letters\/\d+)"/) || ["", "/dead-letters/1"])[1]);
					return list.status + " " + entry.status + "\n" + page + (await entry.text());
				} catch (e) { return "error " + e; }
			})()`, &out, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
		)
		if err != nil {
			t.Fatalf("%s: %v", origin, err)
		}
		return out
	}
	if got := read("http://127.0.0.1:" + u.Port()); !strings.Contains(got, "payment service timeout") {
		t.Fatalf("the script under 127.0.0.1 did not read the list, so this test cannot see a leak:\n%s", cut(got, 500))
	}
	got := read("http://attacker.example:" + u.Port())
	if strings.Contains(got, "payment service") || strings.Contains(got, "csrf") || !strings.HasPrefix(got, "421 421") {
		t.Fatalf("the page under attacker.example read the console:\n%s", cut(got, 800))
	}
}

// TestRelayListens: the relay's listener follows the console's rules: another address
// than loopback needs credentials of a minimum length, and TLS or --allow-plain-http; its
// probes follow the relay's state as JSON without error text; /metrics names event types
// and destinations only to authenticated callers.
func TestRelayListens(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	relay := append(append([]string{"relay"}, tb.flags...), "--transport", "memory://")
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	token := strings.Repeat("t0ken", 8)
	for _, c := range []struct {
		env  map[string]string
		args []string
		says string
	}{
		{nil, []string{"--listen", "0.0.0.0:0"}, "not a loopback address"},
		{nil, []string{"--listen", ":0"}, "OUTBOX_RELAY_TOKEN"},
		{map[string]string{"OUTBOX_RELAY_TOKEN": token}, []string{"--listen", "0.0.0.0:0"}, "--tls-cert"},
		{map[string]string{"OUTBOX_RELAY_TOKEN": "shorttoken"}, []string{"--listen", "127.0.0.1:0"}, "OUTBOX_RELAY_TOKEN is 10 characters"},
		{map[string]string{"OUTBOX_RELAY_USER": "ops", "OUTBOX_RELAY_PASSWORD": "short"}, nil, "OUTBOX_RELAY_PASSWORD is 5 characters"},
		{nil, []string{"--tls-cert", "x.pem"}, "go together"},
	} {
		r := run(t, nil, runOpts{env: c.env, ctx: ctx}, append(append([]string{}, relay...), c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.says) || strings.Contains(r.stderr, "shorttoken") {
			t.Errorf("relay %v (env %v): exit %d, want 2 and %q:\n%s", c.args, c.env, r.code, c.says, r.stderr)
		}
	}

	tb.publish(t, outbox.New(Placed{Order: 1}), outbox.New(Shipped{Order: 2}))
	cert, key := selfSigned(t)
	d := startDaemon(t, []string{"OUTBOX_RELAY_TOKEN=" + token}, append(append([]string{}, relay...),
		"--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key)...)
	base := "https://" + d.addr(t)
	client := tlsClient(t, cert)
	outboxtest.WaitFor(t, deadline, "the relay to deliver", func() bool { return strings.Count(d.stderr(), "msg=delivered") == 2 })
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body := request(t, client, http.MethodGet, base+path, "", nil)
		if code != 200 || body != `{"status":"ok"}`+"\n" {
			t.Errorf("%s without credentials: %d %q", path, code, body)
		}
	}
	if code, _ := request(t, client, http.MethodGet, base+"/metrics", "", nil); code != http.StatusUnauthorized {
		t.Errorf("/metrics without the token: %d, want 401", code)
	}
	code, metrics := request(t, client, http.MethodGet, base+"/metrics", "", http.Header{"Authorization": {"Bearer " + token}})
	if code != 200 || !strings.Contains(metrics, `cloudevents_event_type="orders.shipped"`) || !strings.Contains(metrics, `messaging_destination_name="memory"`) {
		t.Errorf("/metrics with the token: %d, no event types or destinations:\n%s", code, cut(metrics, 3000))
	}
	if got := d.stop(t); got != 0 {
		t.Fatalf("exit %d:\n%s", got, d.stderr())
	}

	// Without credentials (loopback only): /metrics without event types and destinations,
	// totals kept.
	tb.publish(t, outbox.New(Placed{Order: 3}), outbox.New(Shipped{Order: 4}), outbox.New(Shipped{Order: 5}))
	d = startDaemon(t, nil, append(append([]string{}, relay...), "--listen", "127.0.0.1:0")...)
	base = "http://" + d.addr(t)
	outboxtest.WaitFor(t, deadline, "the relay to deliver", func() bool { return strings.Count(d.stderr(), "msg=delivered") == 3 })
	outboxtest.WaitFor(t, deadline, "/metrics to count 3 sent", func() bool {
		_, metrics = request(t, nil, http.MethodGet, base+"/metrics", "", nil)
		return regexp.MustCompile(`messaging_client_sent_messages_total\{[^}]*\} 3\n`).MatchString(metrics)
	})
	if strings.Contains(metrics, "cloudevents_event_type") || strings.Contains(metrics, "messaging_destination_name") || strings.Contains(metrics, "orders.shipped") {
		t.Errorf("/metrics without credentials names event types or destinations:\n%s", cut(metrics, 3000))
	}
}

// TestProbes: /healthz is 200 while Run runs, the broker or the database unavailable or
// not (restarting would not bring them back); /readyz is 503 unless both are available;
// both say the state and since when, never an error's text.
func TestProbes(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	secret := fmt.Errorf("dial tcp 10.1.2.3:5432: password authentication failed for user s3cret")
	for _, c := range []struct {
		state          relay.State
		done           bool
		healthz, ready int
		body           string
	}{
		{relay.State{}, false, 200, 503, `{"status":"starting"}`},
		{relay.State{Running: true}, false, 200, 200, `{"status":"ok"}`},
		{relay.State{Running: true, BrokerUnavailableSince: since, BrokerErr: secret}, false, 200, 503,
			`{"status":"unavailable","broker_unavailable_since":"2026-11-23T10:00:00Z"}`},
		{relay.State{Running: true, DatabaseUnavailableSince: since, DatabaseErr: secret}, false, 200, 503,
			`{"status":"unavailable","database_unavailable_since":"2026-11-23T10:00:00Z"}`},
		{relay.State{}, true, 503, 503, `{"status":"stopped"}`},
	} {
		p := probes{state: func() relay.State { return c.state }, done: func() bool { return c.done }}
		for _, x := range []struct {
			h    http.HandlerFunc
			want int
		}{{p.healthz, c.healthz}, {p.readyz, c.ready}} {
			w := httptest.NewRecorder()
			x.h(w, httptest.NewRequest(http.MethodGet, "/", nil))
			if w.Code != x.want || w.Body.String() != c.body+"\n" || w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("%+v: %d %q, want %d %s", c.state, w.Code, w.Body, x.want, c.body)
			}
		}
	}
}

// TestConsoleAuth: a token or password under the minimum length is refused at start (its
// value not printed); failed logins are throttled per client, even with the right
// credentials once the client has spent its attempts; the audit names only authenticated
// callers; the "Replayed" notice shows only after this browser's replay.
func TestConsoleAuth(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	ids := seedDeadLetters(t, tb)
	r := run(t, tb, runOpts{env: map[string]string{"OUTBOX_CONSOLE_TOKEN": "letmein"}}, "serve", "--listen", "127.0.0.1:0")
	if r.code != exitUsage || !strings.Contains(r.stderr, "OUTBOX_CONSOLE_TOKEN is 7 characters") || strings.Contains(r.stderr, "letmein") {
		t.Fatalf("a short token: exit %d, %s", r.code, r.stderr)
	}

	env := []string{"OUTBOX_CONSOLE_USER=" + consoleUser, "OUTBOX_CONSOLE_PASSWORD=" + consolePassword}
	base := startConsole(t, tb, env)
	for i := range failedBurst {
		req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
		req.SetBasicAuth(consoleUser, fmt.Sprint("guess-", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
	req.SetBasicAuth(consoleUser, consolePassword)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("after %d failed logins, the right password: %d, want 429", failedBurst, resp.StatusCode)
	}

	// No credentials configured: a basic-auth header proves nothing and is not logged as
	// who acted; the notice needs this browser's own replay.
	open, d := startConsoleDaemon(t, tb, nil, "--allow-actions")
	entry := fmt.Sprintf("%s/dead-letters/%d", open, ids["gave-up"])
	if _, page := getPage(t, entry+"?done=replay"); strings.Contains(page, "Replayed") {
		t.Fatalf("a link with ?done=replay shows a notice for a replay that did not happen")
	}
	resp, err = http.Get(entry)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == csrfCookie {
			cookie = c
		}
	}
	token := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindSubmatch(page)
	if cookie == nil || token == nil {
		t.Fatalf("no CSRF cookie or token:\n%s", page)
	}
	form := url.Values{"csrf": {string(token[1])}}
	req, _ = http.NewRequest(http.MethodPost, entry+"/replay", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("mallory", "anything")
	req.AddCookie(cookie)
	resp, err = (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	location := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(location, "done=replay") {
		t.Fatalf("replay: %d, Location %q", resp.StatusCode, location)
	}
	outboxtest.WaitFor(t, deadline, "the audit line", func() bool { return strings.Contains(d.stderr(), "dead letter replayed") })
	if line := grepLines(d.stderr(), "dead letter replayed"); strings.Contains(line, "mallory") || !regexp.MustCompile(`by=127\.0\.0\.1:\d+`).MatchString(line) {
		t.Fatalf("the audit takes a name no credentials proved: %s", line)
	}
	code, body := request(t, nil, http.MethodGet, open+location, "", http.Header{"Cookie": {cookie.Name + "=" + cookie.Value}})
	if code != 200 || !strings.Contains(body, "Replayed: the event is back") {
		t.Fatalf("after the replay, its notice: %d\n%s", code, cut(body, 2000))
	}
	if _, body := getPage(t, open+location); strings.Contains(body, "Replayed: the event") {
		t.Fatalf("the notice's link works in another browser (without its cookie)")
	}
}

// TestThrottle: the failed-login throttle refills with time, and forgets clients whose
// bucket is full when its table is full.
func TestThrottle(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	th := newThrottle()
	th.now = func() time.Time { return now }
	for range failedBurst {
		if !th.allow("a") {
			t.Fatal("refused within the burst")
		}
		th.failed("a")
	}
	if th.allow("a") || !th.allow("b") {
		t.Fatal("a spent its attempts; b did not")
	}
	now = now.Add(failedRefill)
	if !th.allow("a") {
		t.Fatal("no attempt after a refill period")
	}
	th.failed("a")
	if th.allow("a") {
		t.Fatal("two attempts after one refill period")
	}
	for i := range maxClients + 5 {
		th.allow(strconv.Itoa(i))
	}
	if len(th.buckets) > maxClients+1 {
		t.Fatalf("%d buckets, want at most %d", len(th.buckets), maxClients+1)
	}
}

// TestCredentialsCompare: a token matches only whole; a prefix, a longer value or another
// scheme does not. (The comparison is of SHA-256 digests in constant time: neither its
// time nor its result depends on the token's length.)
func TestCredentialsCompare(t *testing.T) {
	t.Parallel()
	c := credentials{token: strings.Repeat("x", 40), user: "ops", password: consolePassword}
	for _, x := range []struct {
		authz string
		ok    bool
	}{
		{"Bearer " + strings.Repeat("x", 40), true},
		{"Bearer " + strings.Repeat("x", 39), false},
		{"Bearer " + strings.Repeat("x", 41), false},
		{"Bearer ", false},
		{"Basic " + basic("ops", consolePassword), true},
		{"Basic " + basic("ops", consolePassword+"x"), false},
		{"Basic " + basic("op", consolePassword), false},
		{"Digest x", false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", x.authz)
		if _, ok, presented := c.check(r); ok != x.ok || !presented {
			t.Errorf("%q: %v (presented %v), want %v", x.authz, ok, presented, x.ok)
		}
	}
	if _, ok, _ := (credentials{token: strings.Repeat("x", 40)}).check(basicRequest("", "")); ok {
		t.Error("empty basic credentials matched a console without a user")
	}
}

func basic(user, password string) string {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth(user, password)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func basicRequest(user, password string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth(user, password)
	return r
}

// TestConsoleTLS: the console serves HTTPS with --tls-cert and --tls-key, its CSRF cookie
// marked Secure.
func TestConsoleTLS(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	ids := seedDeadLetters(t, tb)
	cert, key := selfSigned(t)
	base := strings.Replace(startConsole(t, tb, nil, "--tls-cert", cert, "--tls-key", key, "--allow-actions"), "http://", "https://", 1)
	resp, err := tlsClient(t, cert).Get(fmt.Sprintf("%s/dead-letters/%d", base, ids["gave-up"]))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(resp.Cookies()) != 1 || !resp.Cookies()[0].Secure {
		t.Fatalf("over HTTPS: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	r := run(t, tb, runOpts{}, "serve", "--tls-cert", cert, "--tls-key", filepath.Join(t.TempDir(), "missing.pem"))
	if r.code != exitUsage || !strings.Contains(r.stderr, "--tls-key") {
		t.Fatalf("a missing key: exit %d, %s", r.code, r.stderr)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns their files.
func selfSigned(t *testing.T) (cert, key string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// tlsClient trusts the certificate in file cert.
func tlsClient(t *testing.T, cert string) *http.Client {
	t.Helper()
	pemBytes, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}
