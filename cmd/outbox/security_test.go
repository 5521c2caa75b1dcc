package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
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

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	cdppage "github.com/chromedp/cdproto/page"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
	"github.com/txoutbox/outbox/outboxtest"
)

// The tests of docs/security.md, one (or more) per finding of issue 23.

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

// TestBoundedMemoryByGET: lists never select bodies, headers or raw evidence; an entry's
// page shows the start of a large body (marked truncated) with a download link of its own
// that streams it whole; the command line does the same.
func TestBoundedMemoryByGET(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		tb.migrate(t)
		ctx := context.Background()
		dead := tb.deadLetters(t)
		big := bytes.Repeat([]byte(`{"line":"0123456789abcdef"}`+"\n"), 40000) // ~1 MiB, not JSON as a whole
		m, _ := outbox.New(Placed{Order: 1}).Encode()
		m.Body = big
		if err := dead.Add(ctx, deadletter.Entry{Message: m, Stage: deadletter.StageRelay, Kind: deadletter.KindTooLarge, Reason: "too large", Attempts: 1}); err != nil {
			t.Fatal(err)
		}
		rawBody := bytes.Repeat([]byte{0xff, 0x00}, 300000)
		if err := dead.Add(ctx, deadletter.Entry{Stage: deadletter.StageConsumer, Kind: deadletter.KindMalformed, Consumer: "billing", Reason: "malformed",
			Attempts: 1, Raw: &deadletter.Raw{Attributes: map[string]string{"ce-id": "x"}, Body: rawBody}}); err != nil {
			t.Fatal(err)
		}
		es, err := dead.List(ctx, deadletter.Filter{})
		if err != nil || len(es) != 2 {
			t.Fatal(es, err)
		}
		id, malformed := strconv.FormatInt(es[0].ID, 10), strconv.FormatInt(es[1].ID, 10)

		r := ok(t, tb, "dead-letters", "list", "--json", "--status", "all")
		var listed []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 2 {
			t.Fatalf("%v: %s", err, cut(r.stdout, 500))
		}
		if len(r.stdout) > 4000 || listed[0]["event"].(map[string]any)["body_bytes"] != float64(len(big)) || listed[1]["raw_bytes"] == nil {
			t.Fatalf("list --json printed %d bytes (bodies?), want none, with their sizes:\n%s", len(r.stdout), cut(r.stdout, 1500))
		}
		r = ok(t, tb, "dead-letters", "show", id)
		if len(r.stdout) > 3*previewBytes || !strings.Contains(r.stdout, "show --body "+id) {
			t.Fatalf("show printed %d bytes of a 1 MiB body, without saying how to get it whole", len(r.stdout))
		}
		if r = ok(t, tb, "dead-letters", "show", "--body", id); r.stdout != string(big) {
			t.Fatalf("show --body: %d bytes, want the %d of the body", len(r.stdout), len(big))
		}
		if r = ok(t, tb, "dead-letters", "show", "--raw", malformed); !strings.HasSuffix(r.stdout, "\n\n"+string(rawBody)) || !strings.HasPrefix(r.stdout, "txoutbox-raw/1\n") {
			t.Fatalf("show --raw: %d bytes", len(r.stdout))
		}

		if tb.Dialect != "sqlite" {
			return // the console's reads are the same statements
		}
		base := startConsole(t, tb, nil)
		code, page := getPage(t, base+"/dead-letters/"+id)
		if code != 200 || len(page) > 3*previewBytes || !strings.Contains(page, `id="body-cut"`) || !strings.Contains(page, `href="/dead-letters/`+id+`/body"`) {
			t.Fatalf("the entry page: %d, %d bytes, truncation shown: %v", code, len(page), strings.Contains(page, "body-cut"))
		}
		if code, body := getPage(t, base+"/dead-letters/"+id+"/body"); code != 200 || body != string(big) {
			t.Fatalf("the body's download: %d, %d bytes, want %d", code, len(body), len(big))
		}
		code, page = getPage(t, base+"/dead-letters/"+malformed)
		if code != 200 || len(page) > 8*previewBytes || !strings.Contains(page, `id="raw-cut"`) || !strings.Contains(page, `attribute &#34;ce-id&#34;`) {
			t.Fatalf("the malformed entry's page: %d, %d bytes:\n%s", code, len(page), cut(page, 2000))
		}
		if code, body := getPage(t, base+"/dead-letters/"+malformed+"/raw"); code != 200 || !strings.HasSuffix(body, string(rawBody)) {
			t.Fatalf("the raw evidence's download: %d, %d bytes", code, len(body))
		}
		if code, _ := getPage(t, base+"/dead-letters/"+id+"/raw"); code != http.StatusNotFound {
			t.Fatalf("the raw evidence of an entry without any: %d", code)
		}
		if code, page := getPage(t, base+"/dead-letters?status=all&limit=500"); code != 200 || len(page) > 20000 {
			t.Fatalf("the list: %d, %d bytes", code, len(page))
		}
		if code, _ := getPage(t, base+"/dead-letters?limit=100000"); code != http.StatusBadRequest {
			t.Fatalf("?limit=100000: %d, want 400", code)
		}
	})
}

// TestSecretsNeverPrinted: secrets from the environment or the command line appear in no
// usage text, flag error, parse error or log line, whatever the URL's or DSN's form.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "app.db")
	ok(t, nil, "migrate", "--database-url", db)
	leaks := func(t *testing.T, r result, secrets ...string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(r.stdout+r.stderr, s) {
				t.Errorf("printed %q:\nstdout: %s\nstderr: %s", s, r.stdout, r.stderr)
			}
		}
	}
	env := map[string]string{
		"OUTBOX_DATABASE_URL":  "postgres://app:s3cretDB@127.0.0.1:1/test?connect_timeout=1",
		"OUTBOX_TRANSPORT_URL": "nats://s3cretTOKEN@127.0.0.1:1",
	}
	for _, args := range [][]string{{"status", "--bogus"}, {"status", "-h"}, {"relay", "-h"}, {"relay", "--bogus"}, {"serve", "-h"},
		{"dead-letters", "list", "-h"}, {"prune", "-h"}} {
		r := run(t, nil, runOpts{env: env}, args...)
		leaks(t, r, "s3cretDB", "s3cretTOKEN")
		if !strings.Contains(r.stderr, "OUTBOX_DATABASE_URL, which is set") {
			t.Errorf("%v: the usage does not say the variable is set:\n%s", args, r.stderr)
		}
	}
	// A token without a password (NATS): neither shown in the log nor in the error.
	r := run(t, nil, runOpts{}, "relay", "--database-url", db, "--transport", "nats://s3cretTOKEN@127.0.0.1:1", "--listen", "")
	leaks(t, r, "s3cretTOKEN")
	if r.code == 0 || !strings.Contains(r.stderr, "nats://xxxxx@127.0.0.1:1") {
		t.Errorf("nats with a token: exit %d, %s", r.code, r.stderr)
	}
	// Passwords with characters a URL reserves: no piece of them, whatever parses.
	for _, u := range []string{
		"postgres://app:s3c/retPW@127.0.0.1:1/test?connect_timeout=1",
		"postgres://app:s3c#retPW@127.0.0.1:1/test",
		"postgres://app:s3c?retPW@127.0.0.1:1/test",
		"mysql://app:s3c/retPW@127.0.0.1:1/test",
		"postgres://app:12/34retPW@127.0.0.1:1/test",
		"postgres://:s3cretPW@127.0.0.1:1/test?connect_timeout=1",
	} {
		for _, args := range [][]string{{"status", "--database-url", u}, {"relay", "--database-url", db, "--transport", u, "--listen", ""}} {
			r := run(t, nil, runOpts{}, args...)
			if r.code == 0 {
				t.Errorf("%v succeeded", args)
			}
			leaks(t, r, "s3c", "retPW", "34ret")
		}
	}
	// A keyword/value DSN is PostgreSQL's, never a SQLite file named after it.
	r = run(t, nil, runOpts{}, "status", "--database-url", "host=127.0.0.1 port=1 user=app password='s3cret PW' dbname=test connect_timeout=1")
	leaks(t, r, "s3cret PW", "s3cret")
	if r.code != exitFailure || !strings.Contains(r.stderr, "password=xxxxx") || strings.Contains(r.stderr, "SQLite") {
		t.Errorf("a keyword DSN: exit %d, %s", r.code, r.stderr)
	}
	r = run(t, nil, runOpts{}, "status", "--database-url", "app:s3cretPW@tcp(127.0.0.1:1)/test")
	leaks(t, r, "s3cretPW")
	if r.code != exitUsage {
		t.Errorf("user:password@ without a scheme: exit %d, %s", r.code, r.stderr)
	}
}

// TestKeywordDSN: a libpq keyword/value connection string opens PostgreSQL, shown without
// its password.
func TestKeywordDSN(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "postgres", outboxsql.Postgres, "pgx")
	tb.migrate(t)
	u, err := url.Parse(sqlstoretest.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	dsn := fmt.Sprintf("host=%s port=%s user=%s password='%s' dbname=%s sslmode=disable", u.Hostname(), port, u.User.Username(), pw+"-ignored-by-trust", strings.TrimPrefix(u.Path, "/"))
	args := []string{"status", "--database-url", dsn}
	if tb.Tables.Schema != "" {
		args = append(args, "--schema", tb.Tables.Schema)
	}
	if tb.Tables.Outbox != "" {
		args = append(args, "--table", tb.Tables.Outbox)
	}
	r := ok(t, nil, args...)
	if !strings.Contains(r.stdout, "password=xxxxx") || strings.Contains(r.stdout, "ignored-by-trust") {
		t.Fatalf("status with a keyword DSN:\n%s", r.stdout)
	}
}

// TestControlAndFormatCharactersEscaped: C0 and C1 controls, bidi overrides and zero-width
// characters from the tables reach neither the terminal nor a page as they are.
func TestControlAndFormatCharactersEscaped(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	m, _ := outbox.New(Placed{Order: 1}, outbox.WithKey("acct\u200b-1")).Encode()
	m.Type = "invoice\u202Efdp.exe"
	m.Body = []byte("plain text \u009b31m red \u009d0;title\u0007 and \u2066isolate\u2069 \ufeff")
	m.Headers = map[string]string{"x-note\u202e": "v\u009b2J"}
	if err := tb.deadLetters(t).Add(context.Background(), deadletter.Entry{Message: m, Stage: deadletter.StageConsumer, Consumer: "bill\u202eing",
		Reason: "failed: \u009b2J\u202e", Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	bad := []string{"\u009b", "\u009d", "\u202e", "\u200b", "\u2066", "\ufeff", "\x07"}
	check := func(where, out string) {
		t.Helper()
		for _, c := range bad {
			if strings.Contains(out, c) {
				t.Errorf("%s shows %U as it is:\n%q", where, []rune(c)[0], cut(out, 2000))
			}
		}
		if !strings.Contains(out, `invoice\u202efdp.exe`) {
			t.Errorf("%s does not show the type escaped:\n%q", where, cut(out, 2000))
		}
	}
	check("dead-letters list", ok(t, tb, "dead-letters", "list").stdout)
	show := ok(t, tb, "dead-letters", "show", "1").stdout
	check("dead-letters show", show)
	if !strings.Contains(show, `\u009b31m red`) || !strings.Contains(show, `acct\u200b-1`) {
		t.Errorf("show does not escape the payload and the key:\n%s", show)
	}
	check("status", ok(t, tb, "status").stdout)
	base := startConsole(t, tb, nil)
	for _, path := range []string{"/dead-letters", "/dead-letters/1", "/"} {
		_, page := getPage(t, base+path)
		check("the console's "+path, page)
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
		state          outbox.RelayState
		done           bool
		healthz, ready int
		body           string
	}{
		{outbox.RelayState{}, false, 200, 503, `{"status":"starting"}`},
		{outbox.RelayState{Running: true}, false, 200, 200, `{"status":"ok"}`},
		{outbox.RelayState{Running: true, BrokerUnavailableSince: since, BrokerErr: secret}, false, 200, 503,
			`{"status":"unavailable","broker_unavailable_since":"2026-11-23T10:00:00Z"}`},
		{outbox.RelayState{Running: true, DatabaseUnavailableSince: since, DatabaseErr: secret}, false, 200, 503,
			`{"status":"unavailable","database_unavailable_since":"2026-11-23T10:00:00Z"}`},
		{outbox.RelayState{}, true, 503, 503, `{"status":"stopped"}`},
	} {
		p := probes{state: func() outbox.RelayState { return c.state }, done: func() bool { return c.done }}
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

// TestPruneInboxRetentionFloor: an inbox retention under a day is refused unless forced:
// a key pruned while its event can still be redelivered lets its handler run twice.
func TestPruneInboxRetentionFloor(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	for _, d := range []string{"0s", "1h", "23h59m"} {
		r := want(t, tb, exitUsage, "prune", "--inbox-retention", d)
		if !strings.Contains(r.stderr, "--force") {
			t.Errorf("--inbox-retention %s: %s", d, r.stderr)
		}
	}
	ok(t, tb, "prune", "--inbox-retention", "24h")
	ok(t, tb, "prune", "--inbox-retention", "0s", "--force")
	ok(t, tb, "prune", "--dead-letters-retention", "0s")
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

// TestRedactorFindsEverySecret: the secrets of every form of URL and connection string
// are found before anything parses them, in each encoding a library may print.
func TestRedactorFindsEverySecret(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw     string
		printed []string // what must come out redacted
		kept    []string // what must stay (no over-redaction of the rest)
	}{
		{"postgres://app:s3cret@db:5432/x", []string{"s3cret"}, []string{"app", "db:5432"}},
		{"postgres://app:s3c%2Fret@db/x", []string{"s3c%2Fret", "s3c/ret"}, []string{"app"}},
		{"postgres://app:s3c/ret@db/x", []string{"s3c/ret"}, []string{"app"}},
		{"postgres://app:s3c#ret@db/x", []string{"s3c#ret"}, nil},
		{"postgres://app:p@ss?w/rd@db/x", []string{"p@ss?w/rd"}, nil},
		{"nats://s3cretTOKEN@n1:4222,n2:4222", []string{"s3cretTOKEN"}, []string{"n1:4222"}},
		{"amqp://guest@rabbit:5672/", nil, []string{"guest"}},
		{"postgres://db/x?password=s3cret&sslpassword=k3y&application_name=me", []string{"s3cret", "k3y"}, []string{"me"}},
		{"host=db user=app password='s3c ret\\'x' dbname=x", []string{"s3c ret'x"}, []string{"app"}},
		{"host=db password=s3cret", []string{"s3cret"}, []string{"db"}},
		{"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=k3y==;QueueEndpoint=https://q", []string{"k3y=="}, []string{"acct"}},
		{"sqs://q?region=r&endpoint=https%3A%2F%2Fu%3As3cret%40host", []string{"s3cret"}, []string{"host"}},
	} {
		r := &redactor{}
		r.addAny(c.raw)
		for _, s := range c.printed {
			if got := r.redact("before " + s + " after"); got != "before xxxxx after" {
				t.Errorf("%s: %q printed as %q", c.raw, s, got)
			}
		}
		for _, s := range c.kept {
			if got := r.redact(s); got != s {
				t.Errorf("%s: %q redacted to %q", c.raw, s, got)
			}
		}
	}
}
