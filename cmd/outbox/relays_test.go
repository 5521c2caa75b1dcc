package main

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestRelayConfigFile: `outbox relay --config FILE` serves the outboxes of the file —
// two schemas of one PostgreSQL database (one connection pool) and a SQLite file — in one
// process, an outbox whose database is down left out at start; /readyz counts them and
// /outboxes names them; SIGHUP reads the file again,
// removing, adding and keeping outboxes, and a broken file changes nothing; the database
// password, given through the environment, is printed nowhere; SIGTERM exits 0.
func TestRelayConfigFile(t *testing.T) {
	pgA := newTestDB(t, "postgres", outboxsql.Postgres, "pgx")
	pgB := newTestDB(t, "postgres", outboxsql.Postgres, "pgx")
	pgC := newTestDB(t, "postgres", outboxsql.Postgres, "pgx")
	lite := newTestDB(t, "sqlite", outboxsql.SQLite, "sqlite")
	for _, tb := range []*testDB{pgA, pgB, pgC, lite} {
		tb.migrate(t)
	}
	// PostgreSQL's trust authentication ignores the password: it only has to stay unprinted.
	const password = "s3cret-Pa55word"
	u, err := url.Parse(pgA.url)
	if err != nil || u.Scheme == "" {
		t.Fatalf("the PostgreSQL URL %s is not a URL to add a password to: %v", outboxtest.Shown(pgA.url), err)
	}
	u.User = url.UserPassword(u.User.Username(), password) // no user: pgx's default user
	withPassword := u.String()
	spec := func(name string, tb *testDB, env bool) map[string]any {
		s := map[string]any{"name": name, "transport": "memory://", "schema": tb.Tables.Schema}
		if tb.Tables.Outbox != "" {
			s["table"] = tb.Tables.Outbox
		}
		if env {
			s["database_url_env"] = "TENANTS_PG_URL"
		} else {
			s["database_url"] = tb.url
		}
		return s
	}
	path := filepath.Join(t.TempDir(), "outboxes.json")
	write := func(outboxes ...map[string]any) {
		b, err := json.Marshal(map[string]any{"max_cycles": 4, "outboxes": outboxes})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// "down": a database nobody listens at. It is left out at start; the others run.
	const downPassword = "d0wn-Pa55word"
	down := map[string]any{"name": "down", "transport": "memory://", "database_url": "postgres://postgres:" + downPassword + "@127.0.0.1:1/test?connect_timeout=2"}
	write(spec("tenant-a", pgA, true), spec("tenant-b", pgB, true), spec("local", lite, false), down)

	d := startDaemon(t, []string{"TENANTS_PG_URL=" + withPassword, "OUTBOX_DATABASE_URL=", "OUTBOX_TRANSPORT_URL="},
		"relay", "--config", path, "--listen", "127.0.0.1:0", "--name", "cli-group")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", cut(d.stderr(), 5000))
		}
	})
	addr := d.addr(t)
	delivered := func(e outbox.Event[Placed]) func() bool {
		return func() bool { return strings.Contains(d.stderr(), "event_id="+e.ID.String()) }
	}
	publish := func(tb *testDB) outbox.Event[Placed] {
		e := outbox.New(Placed{Order: 1})
		tb.publish(t, e)
		return e
	}
	for name, tb := range map[string]*testDB{"tenant-a": pgA, "tenant-b": pgB, "local": lite} {
		outboxtest.WaitFor(t, deadline, "an event of "+name+" delivered", delivered(publish(tb)))
	}
	outboxtest.WaitFor(t, deadline, "/readyz to say ok", func() bool {
		code, body := get(t, "http://"+addr+"/readyz")
		return code == 200 && body == `{"status":"ok","outboxes":3,"unavailable":0}`+"\n"
	})
	if code, body := get(t, "http://"+addr+"/outboxes"); code != 200 || !strings.Contains(body, `"tenant-a":{"status":"ok"}`) {
		t.Errorf("/outboxes: %d %s", code, body)
	}

	// Reload: tenant-b goes, tenant-c comes, tenant-a and local stay.
	write(spec("tenant-a", pgA, true), spec("tenant-c", pgC, true), spec("local", lite, false))
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, deadline, "the reload", func() bool { return strings.Contains(d.stderr(), "msg=reloaded") })
	outboxtest.WaitFor(t, deadline, "an event of tenant-c delivered", delivered(publish(pgC)))
	outboxtest.WaitFor(t, deadline, "an event of tenant-a delivered after the reload", delivered(publish(pgA)))
	stale := publish(pgB)
	if strings.Count(d.stderr(), "msg=\"outbox added\" outbox=tenant-a") != 1 {
		t.Errorf("tenant-a was restarted by a reload that did not change it:\n%s", grepLines(d.stderr(), "outbox (added|removed)"))
	}
	code, body := get(t, "http://"+addr+"/outboxes")
	if code != 200 || strings.Contains(body, "tenant-b") || !strings.Contains(body, "tenant-c") {
		t.Errorf("/outboxes after the reload: %d %s", code, body)
	}

	// A broken file changes nothing.
	if err := os.WriteFile(path, []byte(`{"outboxes": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, deadline, "the reload refused", func() bool { return strings.Contains(d.stderr(), "reload refused") })
	outboxtest.WaitFor(t, deadline, "tenant-c to deliver after the refused reload", delivered(publish(pgC)))

	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, cut(d.stderr(), 3000))
	}
	if delivered(stale)() {
		t.Error("an event of the removed tenant-b was delivered")
	}
	if !strings.Contains(d.stderr(), `msg="outbox not started" outbox=down`) {
		t.Errorf("the outbox whose database is down was not reported:\n%s", cut(d.stderr(), 3000))
	}
	if strings.Contains(d.stderr(), password) || strings.Contains(d.stderr(), downPassword) {
		t.Errorf("the password was printed:\n%s", d.stderr())
	}
	if n := len(regexp.MustCompile(`msg="outbox added"`).FindAllString(d.stderr(), -1)); n != 4 {
		t.Errorf("%d outboxes added, want 4 (3, then tenant-c):\n%s", n, grepLines(d.stderr(), "outbox (added|removed)"))
	}
}

// TestRelayConfigFileErrors: a file with problems is refused at start with every problem
// named by outbox and field, and no URL's value.
func TestRelayConfigFileErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outboxes.json")
	file := `{"outboxes": [
		{"name": "a", "database_url": "postgres://u:hunter22@127.0.0.1:1/db", "database_url_env": "X", "transport": "memory://"},
		{"name": "a", "database_url": "postgres://u:hunter22@127.0.0.1:1/db"},
		{"name": "bad name", "database_url_env": "UNSET_FOR_THIS_TEST", "transport": "memory://", "lease": "soon"}
	]}`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, runOpts{}, "relay", "--config", path, "--listen", "")
	stderr := r.stderr
	if r.code != exitUsage {
		t.Errorf("exit %d, want %d", r.code, exitUsage)
	}
	for _, want := range []string{`outboxes[0] "a": set database_url or database_url_env, not both`,
		`outboxes[1] "a": the name is taken`, `outboxes[1] "a": no transport`,
		`outboxes[2] "bad name": database_url_env names UNSET_FOR_THIS_TEST, which is not set`, `outboxes[2] "bad name": lease`} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "hunter22") {
		t.Errorf("a password was printed:\n%s", stderr)
	}
}
