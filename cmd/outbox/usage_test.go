package main

import (
	"debug/elf"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsageErrors: mistakes exit 2 and name the flag or the setting at fault.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  map[string]string
		code int
		says []string
	}{
		{nil, nil, exitUsage, []string{"usage: outbox COMMAND"}},
		{[]string{"help"}, nil, exitOK, nil},
		{[]string{"frobnicate"}, nil, exitUsage, []string{`unknown command "frobnicate"`}},
		{[]string{"status"}, nil, exitUsage, []string{"OUTBOX_DATABASE_URL", "--database-url"}},
		{[]string{"status", "--database-url", "oracle://db"}, nil, exitUsage, []string{`unknown scheme "oracle"`}},
		{[]string{"status", "--table", "x;drop", "--schema", "a b"}, map[string]string{"OUTBOX_DATABASE_URL": "sqlite:///nowhere.db"},
			exitUsage, []string{"--table: ", `"x;drop"`, "--schema: "}},
		{[]string{"status", "--bogus"}, nil, exitUsage, []string{"flag provided but not defined: -bogus"}},
		{[]string{"status", "extra"}, nil, exitUsage, []string{`unexpected argument "extra"`}},
		{[]string{"dead-letters"}, nil, exitUsage, []string{"list|show|replay|discard"}},
		{[]string{"dead-letters", "list", "--limit", "0", "--database-url", "sqlite:///x.db"}, nil, exitUsage, []string{"--limit 0"}},
		{[]string{"dead-letters", "replay", "--progress", "fancy", "1"}, nil, exitUsage, []string{"--progress"}},
		{[]string{"migrate", "--script"}, nil, exitUsage, []string{"--dialect"}},
		{[]string{"migrate", "--script", "--dialect", "oracle"}, nil, exitUsage, []string{"--dialect", "oracle"}},
		{[]string{"migrate", "--dry-run", "--check"}, nil, exitUsage, []string{"exclude each other"}},
		{[]string{"status", "--database-url", "sqlite://" + filepath.Join(t.TempDir(), "missing.db")}, nil, exitFailure, []string{"run outbox migrate"}},
	} {
		r := run(t, nil, runOpts{env: c.env}, c.args...)
		if r.code != c.code {
			t.Errorf("outbox %v: exit %d, want %d\n%s", c.args, r.code, c.code, r.stderr)
		}
		for _, s := range c.says {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("outbox %v: stderr lacks %q:\n%s", c.args, s, r.stderr)
			}
		}
	}
}

// TestSecretsAreNeverPrinted: a password in a database URL appears nowhere, neither in our
// messages nor in a driver's errors, and neither does one in a URL that does not parse.
func TestSecretsAreNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://app:s3cretPW%21@127.0.0.1:1/test?connect_timeout=1",
		"postgresql://app@127.0.0.1:1/test?password=s3cretPW!&connect_timeout=1",
		"mysql://app:s3cretPW!@127.0.0.1:1/test?timeout=1s",
		"postgres://app:s3cretPW!@127.0.0.1:port/test",
		"mysql://app:s3cretPW!@[::1/test",
	} {
		for _, args := range [][]string{{"status", "--database-url", u}, {"dead-letters", "list", "--database-url", u, "--json"}} {
			r := run(t, nil, runOpts{}, args...)
			if r.code == 0 {
				t.Errorf("%v succeeded", args)
			}
			for _, secret := range []string{"s3cretPW", "s3cretPW%21"} {
				if strings.Contains(r.stderr+r.stdout, secret) {
					t.Errorf("outbox %s printed the password:\n%s%s", args[0], r.stdout, r.stderr)
				}
			}
		}
	}
	// The environment variable works as the flag does.
	r := run(t, nil, runOpts{env: map[string]string{"OUTBOX_DATABASE_URL": "postgres://app:s3cretPW@127.0.0.1:1/test?connect_timeout=1"}}, "status")
	if r.code != exitFailure || !strings.Contains(r.stderr, "connecting to postgres://app:xxxxx@127.0.0.1:1/test") || strings.Contains(r.stderr, "s3cretPW") {
		t.Errorf("OUTBOX_DATABASE_URL: exit %d, %s", r.code, r.stderr)
	}
}

// TestMySQLURL: a mysql:// URL becomes the driver's DSN, its parameters kept.
func TestMySQLURL(t *testing.T) {
	t.Parallel()
	tg, err := parseDatabaseURL("mysql://app:p%40ss@db.example:3307/shop?tls=skip-verify&timeout=5s", &redactor{})
	if err != nil {
		t.Fatal(err)
	}
	if tg.dsn != "app:p@ss@tcp(db.example:3307)/shop?tls=skip-verify&timeout=5s" || tg.shown != "mysql://app:xxxxx@db.example:3307/shop?tls=skip-verify&timeout=5s" {
		t.Fatalf("dsn %q, shown %q", tg.dsn, tg.shown)
	}
	if tg, _ := parseDatabaseURL("mysql://root@localhost/test", &redactor{}); tg.dsn != "root@tcp(localhost:3306)/test" {
		t.Fatalf("default port: %q", tg.dsn)
	}
	if tg, _ := parseDatabaseURL("./data/app.db", &redactor{}); tg.dialect.Name() != "sqlite" || tg.file != "./data/app.db" {
		t.Fatalf("a file path: %+v", tg)
	}
}

// TestStaticBinary: the command builds without cgo into a static binary that runs, and
// --version says what it is.
func TestStaticBinary(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary asks for a dynamic loader: it is not static")
		}
	}
	out, err := exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal(out, &v); err != nil || v.Version == "" || !strings.HasPrefix(v.Go, "go") {
		t.Fatalf("version --json: %s (%v)", out, err)
	}
	out, err = exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "outbox ") {
		t.Fatalf("version: %s (%v)", out, err)
	}
	// The binary reaches a real database: migrate a fresh SQLite file.
	db := filepath.Join(t.TempDir(), "app.db")
	if out, err := exec.Command(bin, "migrate", "--database-url", db).CombinedOutput(); err != nil || !strings.Contains(string(out), "applied 1 outbox") {
		t.Fatalf("migrate: %s (%v)", out, err)
	}
}
