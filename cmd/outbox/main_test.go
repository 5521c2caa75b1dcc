package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
)

// dialects are the databases every command is tested on.
var dialects = []struct {
	name    string
	dialect *outboxsql.Outbox
	driver  string
}{
	{"postgres", outboxsql.Postgres, "pgx"},
	{"mysql", outboxsql.MySQL, "mysql"},
	{"sqlite", outboxsql.SQLite, "sqlite"},
}

// forEachDialect runs test as a parallel subtest per database.
func forEachDialect(t *testing.T, test func(t *testing.T, tb *testDB)) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			test(t, newTestDB(t, d.name, d.dialect, d.driver))
		})
	}
}

// testDB is a fresh outbox of one test (a schema of its own on PostgreSQL, a table prefix
// on MySQL, a file on SQLite), not migrated, and the command-line flags that name it.
type testDB struct {
	*sqlstoretest.Target
	outbox *outboxsql.Outbox
	url    string
	flags  []string
}

func newTestDB(t *testing.T, name string, d *outboxsql.Outbox, driver string) *testDB {
	t.Helper()
	tg := sqlstoretest.New(t, name, func(dsn string) (*sql.DB, error) { return sql.Open(driver, dsn) })
	o, err := outboxsql.New(d, tg.Tables)
	if err != nil {
		t.Fatal(err)
	}
	tb := &testDB{Target: tg, outbox: o}
	switch name {
	case "postgres":
		tb.url = sqlstoretest.PostgresURL()
	case "mysql":
		cfg, err := mysql.ParseDSN(sqlstoretest.MySQLDSN())
		if err != nil {
			t.Fatal(err)
		}
		u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
		if cfg.Passwd != "" {
			u.User = url.UserPassword(cfg.User, cfg.Passwd)
		} else {
			u.User = url.User(cfg.User)
		}
		tb.url = u.String()
	case "sqlite":
		path, _, _ := strings.Cut(strings.TrimPrefix(tg.DSN, "file:"), "?")
		p, err := url.PathUnescape(path)
		if err != nil {
			t.Fatal(err)
		}
		tb.url = "sqlite://" + p
	}
	tb.flags = []string{"--database-url", tb.url}
	if tg.Tables.Schema != "" {
		tb.flags = append(tb.flags, "--schema", tg.Tables.Schema)
	}
	if tg.Tables.Outbox != "" {
		tb.flags = append(tb.flags, "--table", tg.Tables.Outbox)
	}
	return tb
}

// migrate migrates the outbox through the library, as an application would.
func (tb *testDB) migrate(t *testing.T) {
	t.Helper()
	if err := tb.outbox.Migrate(context.Background(), tb.DB); err != nil {
		t.Fatal(err)
	}
}

func (tb *testDB) deadLetters(t *testing.T) deadletter.Table {
	t.Helper()
	d, err := tb.outbox.NewDeadLetters(tb.DB)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// publish writes events in one committed transaction.
func (tb *testDB) publish(t *testing.T, events ...outbox.Encodable) {
	t.Helper()
	ctx := context.Background()
	tx, err := tb.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.outbox.Publish(ctx, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// scalar runs a query of one integer, written with '?' placeholders.
func (tb *testDB) scalar(t *testing.T, query string, args ...any) int64 {
	t.Helper()
	if tb.Dialect == "postgres" {
		for i := 1; strings.Contains(query, "?"); i++ {
			query = strings.Replace(query, "?", fmt.Sprintf("$%d", i), 1)
		}
	}
	var n int64
	if err := tb.DB.QueryRowContext(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

// runOpts tune a run: what stdin holds, whether it and stderr count as terminals.
type runOpts struct {
	stdin               string
	stdinTTY, stderrTTY bool
	env                 map[string]string
	ctx                 context.Context
}

// run runs the command in process with args (and the outbox's flags after the command
// words, when tb is not nil).
func run(t *testing.T, tb *testDB, o runOpts, args ...string) result {
	t.Helper()
	if tb != nil {
		words := 1
		if args[0] == "dead-letters" || args[0] == "log" {
			words = 2
		}
		args = append(append(append([]string{}, args[:min(words, len(args))]...), tb.flags...), args[min(words, len(args)):]...)
	}
	var stdout, stderr bytes.Buffer
	env := func(k string) string { return o.env[k] }
	a := newApp(strings.NewReader(o.stdin), &stdout, &stderr, env)
	a.stdinTerminal, a.stderrTerminal = o.stdinTTY, o.stderrTTY
	ctx := o.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	code := a.run(ctx, args)
	return result{code, stdout.String(), stderr.String()}
}

// ok runs the command and fails the test unless it exits 0.
func ok(t *testing.T, tb *testDB, args ...string) result {
	t.Helper()
	r := run(t, tb, runOpts{}, args...)
	if r.code != 0 {
		t.Fatalf("outbox %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// want runs the command and checks its exit code.
func want(t *testing.T, tb *testDB, code int, args ...string) result {
	t.Helper()
	r := run(t, tb, runOpts{}, args...)
	if r.code != code {
		t.Fatalf("outbox %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	return r
}

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
)

// binary builds the command once per test run, as a static binary (CGO_ENABLED=0), for the
// tests that run it as a subprocess.
func binary(t *testing.T) string {
	t.Helper()
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outbox-cli-")
		if err != nil {
			binaryErr = err
			return
		}
		binaryPath = filepath.Join(dir, "outbox")
		cmd := exec.Command("go", "build", "-o", binaryPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binaryErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binaryErr != nil {
		t.Fatal(binaryErr)
	}
	return binaryPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaryPath != "" {
		os.RemoveAll(filepath.Dir(binaryPath))
	}
	os.Exit(code)
}

// deadline is how long a test waits for a condition before it fails.
const deadline = 60 * time.Second
