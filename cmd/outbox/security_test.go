package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
)

// The tests of docs/security.md about what the command and the console print and read, one
// (or more) per finding of issue 23; listen_test.go has those about who reaches them.

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
