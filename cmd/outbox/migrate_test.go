package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestMigrate: --dry-run prints the SQL and applies nothing; migrate applies every
// migration once, and a second run is a no-op; --check passes on a current schema and exits
// 5 on a missing one.
func TestMigrate(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		r := want(t, tb, exitSchema, "migrate", "--check")
		if !strings.Contains(r.stderr, "migration 1 (outbox) is not applied") || !strings.Contains(r.stderr, "run outbox migrate") {
			t.Errorf("--check on an empty database says:\n%s", r.stderr)
		}
		if strings.Contains(r.stderr, "outbox: outbox:") {
			t.Errorf("the library's error prefix is printed twice:\n%s", r.stderr)
		}
		r = ok(t, tb, "migrate", "--dry-run")
		if !strings.Contains(r.stdout, "CREATE TABLE") || !strings.Contains(r.stdout, "-- migration 1: outbox") {
			t.Fatalf("--dry-run printed:\n%s", r.stdout)
		}
		want(t, tb, exitSchema, "migrate", "--check") // the dry run applied nothing

		r = ok(t, tb, "migrate")
		if !strings.Contains(r.stdout, "applied 1 outbox, 2 inbox") {
			t.Fatalf("migrate: %s", r.stdout)
		}
		applied := tb.scalar(t, "SELECT count(*) FROM "+tb.migrationsTable())
		r = ok(t, tb, "migrate")
		if !strings.Contains(r.stdout, "nothing to do") {
			t.Fatalf("second migrate: %s", r.stdout)
		}
		if again := tb.scalar(t, "SELECT count(*) FROM "+tb.migrationsTable()); again != applied {
			t.Fatalf("second migrate: %d migrations recorded, then %d", applied, again)
		}
		if r := ok(t, tb, "migrate", "--dry-run"); r.stdout != "" || !strings.Contains(r.stderr, "nothing to apply") {
			t.Fatalf("--dry-run on a current schema: stdout %q, stderr %q", r.stdout, r.stderr)
		}
		r = ok(t, tb, "migrate", "--check", "--json")
		var check struct {
			Current bool
			Pending []int
		}
		if err := json.Unmarshal([]byte(r.stdout), &check); err != nil || !check.Current || len(check.Pending) != 0 {
			t.Fatalf("--check --json: %s (%v)", r.stdout, err)
		}
		// A column dropped by hand is named.
		if tb.Dialect != "sqlite" { // SQLite before 3.35 cannot drop a column; the rest is alike
			if _, err := tb.DB.ExecContext(context.Background(), "ALTER TABLE "+tb.table("_dead_letters")+" DROP COLUMN broker_message_id"); err != nil {
				t.Fatal(err)
			}
			r = want(t, tb, exitSchema, "migrate", "--check")
			if !strings.Contains(r.stderr, "broker_message_id") {
				t.Fatalf("--check after a column was dropped: %s", r.stderr)
			}
		}
	})
}

// TestMigrateScript: the script for migration tools, run by hand on an empty database,
// gives the schema Migrate gives, recorded so that Migrate then has nothing to do.
func TestMigrateScript(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		args := []string{"migrate", "--script", "--dialect", tb.Dialect}
		if tb.Tables.Schema != "" {
			args = append(args, "--schema", tb.Tables.Schema)
		}
		if tb.Tables.Outbox != "" {
			args = append(args, "--table", tb.Tables.Outbox)
		}
		r := ok(t, nil, args...) // no database needed
		if _, err := tb.DB.ExecContext(context.Background(), r.stdout); err != nil {
			t.Fatalf("running the script: %v\n%s", err, r.stdout)
		}
		ok(t, tb, "migrate", "--check")
		if r := ok(t, tb, "migrate"); !strings.Contains(r.stdout, "nothing to do") {
			t.Fatalf("migrate after the script: %s", r.stdout)
		}
	})
}

// table is the quoted, qualified name of the outbox table with suffix.
func (tb *testDB) table(suffix string) string {
	q := func(s string) string {
		if tb.Dialect == "mysql" {
			return "`" + s + "`"
		}
		return `"` + s + `"`
	}
	name := tb.Tables.Outbox
	if name == "" {
		name = "outbox"
	}
	if tb.Tables.Schema != "" {
		return q(tb.Tables.Schema) + "." + q(name+suffix)
	}
	return q(name + suffix)
}

func (tb *testDB) migrationsTable() string { return tb.table("_migrations") }
