package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxtest"
)

// artefacts is where the browser test writes its screenshots (git-ignored).
func artefacts(t *testing.T) string {
	dir := os.Getenv("TXOUTBOX_ARTEFACTS")
	if dir == "" {
		dir = "artefacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// chromium finds the Debian package's browser: a failure under CI, a skip elsewhere.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	outboxtest.RequireService(t, "Chromium (apt-get install chromium)", fmt.Errorf("no chromium on PATH"))
	return ""
}

var consoleRe = regexp.MustCompile(`msg="console serving" addr=http://(127\.0\.0\.1:\d+)`)

// startConsole runs "outbox serve" as a subprocess and returns its base URL.
func startConsole(t *testing.T, tb *testDB, env []string, extra ...string) string {
	t.Helper()
	d := startDaemon(t, env, append(append([]string{"serve"}, tb.flags...), append([]string{"--listen", "127.0.0.1:0"}, extra...)...)...)
	var addr string
	outboxtest.WaitFor(t, deadline, "the console to serve", func() bool {
		if m := consoleRe.FindStringSubmatch(d.stderr()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return "http://" + addr
}

const consoleUser, consolePassword = "ops", "s3cretPW-console"

// browse returns a headless Chromium context that sends the console's basic auth.
func browse(t *testing.T) context.Context {
	t.Helper()
	// A profile of its own, removed once Chromium has exited (it may still be writing when
	// the allocator is cancelled, which t.TempDir's cleanup would report as an error).
	profile, err := os.MkdirTemp("", "outbox-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 1000),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	auth := base64.StdEncoding.EncodeToString([]byte(consoleUser + ":" + consolePassword))
	if err := chromedp.Run(ctx, network.Enable(), network.SetExtraHTTPHeaders(network.Headers{"Authorization": "Basic " + auth})); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return ctx
}

// clickAndLoad clicks the element sel, which navigates (a link, a form's button), and waits
// for the new page's load event: the next action must not run in the page being left, whose
// execution context the navigation destroys under it.
func clickAndLoad(sel string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		loaded := make(chan struct{}, 1)
		chromedp.ListenTarget(lctx, func(ev any) {
			if _, ok := ev.(*cdppage.EventLoadEventFired); ok {
				select {
				case loaded <- struct{}{}:
				default:
				}
			}
		})
		if err := chromedp.Click(sel, chromedp.ByQuery).Do(ctx); err != nil {
			return err
		}
		select {
		case <-loaded:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for the page %s leads to: %w", sel, ctx.Err())
		}
	})
}

// screenshot saves the page as artefacts/console-NAME.png.
func screenshot(t *testing.T, ctx context.Context, name string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		var png []byte
		if err := chromedp.FullScreenshot(&png, 100).Do(ctx); err != nil { // 100: PNG; lower is JPEG
			return err
		}
		return os.WriteFile(filepath.Join(artefacts(t), "console-"+name+".png"), png, 0o644)
	})
}

// TestConsoleInBrowser drives the console in headless Chromium: the status page with its
// chart, the dead letters listed and filtered, one opened (a payload holding <script>
// shows as text), replayed with its button, and re-delivered by the relay. A screenshot of
// each page goes to artefacts/.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "postgres", outboxsql.Postgres, "pgx")
	tb.migrate(t)
	ids := seedDeadLetters(t, tb)
	dead := tb.deadLetters(t)
	for i := range 3 {
		m, _ := outbox.New(Placed{Order: 100 + i}).Encode()
		if err := dead.Add(context.Background(), deadletter.Entry{Message: m, Stage: deadletter.StageConsumer, Kind: deadletter.KindUndecodable,
			Consumer: "shipping", Reason: "cannot decode", Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	base := startConsole(t, tb, []string{"OUTBOX_CONSOLE_USER=" + consoleUser, "OUTBOX_CONSOLE_PASSWORD=" + consolePassword}, "--allow-actions")
	ctx := browse(t)

	var backlog, pending string
	var bars int
	if err := chromedp.Run(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible("#pending"),
		chromedp.Text("#backlog", &backlog),
		chromedp.Text("#pending", &pending),
		chromedp.Evaluate(`document.querySelectorAll("svg.chart rect").length`, &bars),
		screenshot(t, ctx, "status"),
	); err != nil {
		t.Fatal(err)
	}
	if backlog != "0" || pending != "7" || bars == 0 {
		t.Fatalf("status page: backlog %q, pending %q, %d chart bars; want 0, 7 and some", backlog, pending, bars)
	}

	var rows int
	if err := chromedp.Run(ctx,
		chromedp.Navigate(base+"/dead-letters"),
		chromedp.WaitVisible("#entries"),
		chromedp.Evaluate(`document.querySelectorAll("#entries tbody tr").length`, &rows),
		screenshot(t, ctx, "list"),
	); err != nil {
		t.Fatal(err)
	}
	if rows != 7 {
		t.Fatalf("the list shows %d rows, want the 7 pending dead letters", rows)
	}

	var location, firstType string
	if err := chromedp.Run(ctx,
		chromedp.SetValue(`input[name="consumer"]`, "mailer", chromedp.ByQuery),
		clickAndLoad("#apply"),
		chromedp.WaitVisible(`#entries`),
		chromedp.Location(&location),
		chromedp.Evaluate(`document.querySelectorAll("#entries tbody tr").length`, &rows),
		chromedp.Text(`#entries tbody tr td:nth-child(5)`, &firstType, chromedp.ByQuery),
		screenshot(t, ctx, "list-filtered"),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(location, "consumer=mailer") || rows != 1 || firstType != "orders.placed" {
		t.Fatalf("filtered by consumer mailer: %s shows %d rows (%q)", location, rows, firstType)
	}

	var payload, reason string
	var scripts int
	if err := chromedp.Run(ctx,
		clickAndLoad(`#entries tbody tr a`),
		chromedp.WaitVisible("#payload"),
		chromedp.Text("#payload", &payload),
		chromedp.Text("#reason", &reason),
		chromedp.Evaluate(`document.querySelectorAll("script").length`, &scripts),
		screenshot(t, ctx, "entry"),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(payload, `"note": "<script>alert(1)</script>"`) || scripts != 0 {
		t.Fatalf("the payload %q rendered with %d script elements; want it as text and none", payload, scripts)
	}
	if !strings.Contains(reason, "template failed") {
		t.Fatalf("reason %q", reason)
	}

	var flash, status string
	if err := chromedp.Run(ctx,
		clickAndLoad("#replay"),
		chromedp.WaitVisible(".flash"),
		chromedp.Text(".flash", &flash),
		chromedp.Text("h1 .status", &status),
		screenshot(t, ctx, "replayed"),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(flash, "Replayed") || status != "replayed" {
		t.Fatalf("after the Replay button: flash %q, status %q", flash, status)
	}
	e, err := dead.Get(context.Background(), ids["script"])
	if err != nil || e.Status != deadletter.StatusReplayed {
		t.Fatalf("the entry is %v (%v) in the table", e.Status, err)
	}
	// The relay delivers the replayed event again, with its ID.
	store, err := tb.outbox.NewStore(tb.DB)
	if err != nil {
		t.Fatal(err)
	}
	sender := &countingSender{sent: map[uuid.UUID]int{}}
	relay, err := relay.New(store, sender, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(context.Background()); err != nil || n != 1 || sender.sent[e.Message.ID] != 1 {
		t.Fatalf("relaying the replay: %d, %v, sent %v; want the event %s once", n, err, sender.sent, e.Message.ID)
	}

	// A forged form (its token changed in the page) is refused, and nothing changes.
	var refused string
	if err := chromedp.Run(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/dead-letters/%d", base, ids["gave-up"])),
		chromedp.WaitVisible("#discard"),
		chromedp.Evaluate(`document.querySelectorAll('input[name="csrf"]').forEach(i => i.value = "forged")`, nil),
		clickAndLoad("#discard"),
		chromedp.WaitVisible(".error"),
		chromedp.Text(".error", &refused),
		screenshot(t, ctx, "csrf-refused"),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(refused, "CSRF") {
		t.Fatalf("a forged action: %q", refused)
	}
	if e, err := dead.Get(context.Background(), ids["gave-up"]); err != nil || e.Status != deadletter.StatusPending {
		t.Fatalf("the forged discard changed the entry: %v (%v)", e.Status, err)
	}

	var rawBody string
	if err := chromedp.Run(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/dead-letters/%d", base, ids["malformed"])),
		chromedp.WaitVisible("#raw-body"),
		chromedp.Text("#raw-body", &rawBody),
		chromedp.Evaluate(`document.querySelectorAll("#replay").length`, &scripts),
		screenshot(t, ctx, "malformed"),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rawBody, "ff 00 61 62") || scripts != 0 {
		t.Fatalf("malformed entry: raw body %q, %d replay buttons; want the hex dump and none", rawBody, scripts)
	}
}

// post sends a form to the console with basic auth and returns the status and body.
func post(t *testing.T, target string, form url.Values, cookie *http.Cookie, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(consoleUser, consolePassword)
	for k, v := range header {
		req.Header[k] = v
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestConsoleRefuses: the console's safety rules, over plain HTTP: credentials required,
// every action needs the CSRF token of its cookie and a same-origin request, and a console
// started without --allow-actions refuses them all.
func TestConsoleRefuses(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "postgres", outboxsql.Postgres, "pgx")
	tb.migrate(t)
	ids := seedDeadLetters(t, tb)
	env := []string{"OUTBOX_CONSOLE_USER=" + consoleUser, "OUTBOX_CONSOLE_PASSWORD=" + consolePassword}
	base := startConsole(t, tb, env, "--allow-actions")
	entry := fmt.Sprintf("%s/dead-letters/%d", base, ids["gave-up"])

	resp, err := http.Get(entry)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("no credentials: %d", resp.StatusCode)
	}

	// A page gives the browser its CSRF cookie and the form its token.
	req, _ := http.NewRequest(http.MethodGet, entry, nil)
	req.SetBasicAuth(consoleUser, consolePassword)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("no %s header", h)
		}
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == csrfCookie {
			cookie = c
		}
	}
	token := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindSubmatch(page)
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || token == nil {
		t.Fatalf("the entry page set cookie %+v and token %q", cookie, token)
	}
	discard := entry + "/discard"
	dead := tb.deadLetters(t)
	pendingStill := func() {
		t.Helper()
		if e, err := dead.Get(context.Background(), ids["gave-up"]); err != nil || e.Status != deadletter.StatusPending {
			t.Fatalf("the entry is %v (%v) after a refused action", e.Status, err)
		}
	}
	if code, body := post(t, discard, url.Values{}, cookie, nil); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
		t.Fatalf("without the token: %d %s", code, body)
	}
	if code, _ := post(t, discard, url.Values{"csrf": {string(token[1])}}, nil, nil); code != http.StatusForbidden {
		t.Fatalf("without the cookie: %d", code)
	}
	other := &http.Cookie{Name: csrfCookie, Value: strings.Repeat("ab", 32)}
	if code, _ := post(t, discard, url.Values{"csrf": {string(token[1])}}, other, nil); code != http.StatusForbidden {
		t.Fatalf("with another cookie: %d", code)
	}
	if code, _ := post(t, discard, url.Values{"csrf": {string(token[1])}}, cookie, http.Header{"Sec-Fetch-Site": {"cross-site"}}); code != http.StatusForbidden {
		t.Fatalf("a cross-site request: %d", code)
	}
	pendingStill()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ = http.NewRequest(http.MethodPost, discard, strings.NewReader(url.Values{"csrf": {string(token[1])}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(consoleUser, consolePassword)
	req.AddCookie(cookie)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("with the cookie and its token: %d", resp.StatusCode)
	}
	if code, body := post(t, discard, url.Values{"csrf": {string(token[1])}}, cookie, nil); code != http.StatusConflict || !strings.Contains(body, "not pending") {
		t.Fatalf("discarding twice: %d", code)
	}

	// Read-only: no buttons, and a forged action is refused.
	ro := startConsole(t, tb, env)
	req, _ = http.NewRequest(http.MethodGet, fmt.Sprintf("%s/dead-letters/%d", ro, ids["too-large"]), nil)
	req.SetBasicAuth(consoleUser, consolePassword)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(page), `id="replay"`) || !strings.Contains(string(page), "--allow-actions") {
		t.Fatalf("the read-only console offers actions:\n%s", page)
	}
	if code, body := post(t, fmt.Sprintf("%s/dead-letters/%d/replay", ro, ids["too-large"]), url.Values{"csrf": {string(token[1])}}, cookie, nil); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Fatalf("an action on the read-only console: %d %s", code, body)
	}
	if e, err := dead.Get(context.Background(), ids["too-large"]); err != nil || e.Status != deadletter.StatusPending {
		t.Fatalf("the read-only console changed the entry: %v (%v)", e.Status, err)
	}

	// Not loopback without credentials: refused at start.
	r := run(t, tb, runOpts{}, "serve", "--listen", "0.0.0.0:0")
	if r.code != exitUsage || !strings.Contains(r.stderr, "OUTBOX_CONSOLE_TOKEN") {
		t.Fatalf("serve on 0.0.0.0 without credentials: exit %d, %s", r.code, r.stderr)
	}
}

// TestConsoleEscapes: the console's pages escape what the tables hold, in every place.
func TestConsoleEscapes(t *testing.T) {
	t.Parallel()
	tb := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	tb.migrate(t)
	ids := seedDeadLetters(t, tb)
	base := startConsole(t, tb, nil, "--allow-actions")
	for _, path := range []string{"/", "/dead-letters?status=all", fmt.Sprintf("/dead-letters/%d", ids["script"])} {
		code, body := getPage(t, base+path)
		if code != 200 || strings.Contains(body, "<script>") {
			t.Fatalf("%s: %d, holds a raw <script>:\n%s", path, code, body)
		}
	}
	_, body := getPage(t, fmt.Sprintf("%s/dead-letters/%d", base, ids["script"]))
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatalf("the payload is not escaped text:\n%s", body)
	}
	if code, _ := getPage(t, base+"/dead-letters?kind=<script>"); code != http.StatusBadRequest {
		t.Fatalf("a bad filter: %d", code)
	}
}

func getPage(t *testing.T, target string) (int, string) {
	t.Helper()
	resp, err := http.Get(target)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
