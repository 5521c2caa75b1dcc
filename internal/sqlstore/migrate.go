package sqlstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// This file runs migrations: each dialect's SQL files, embedded, rendered for an outbox's
// names, applied once and recorded. schema.go reads what state an outbox's schema is in.

//go:embed migrations
var migrationFiles embed.FS

// Migration is one versioned schema change; SQL is a text/template over [Names].
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// migrationName is what a migration's name may hold: it is spliced into the statement that
// records it.
var migrationName = regexp.MustCompile(`^[a-z0-9_]+$`)

// loadMigrations reads migrations/<dialect>/NNN_name.sql.
func loadMigrations(dialect string) []Migration {
	dir := path.Join("migrations", dialect)
	entries, err := fs.ReadDir(migrationFiles, dir)
	if err != nil {
		panic(err) // embedded at build time: a missing directory is a build bug
	}
	var out []Migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !migrationName.MatchString(name) {
			panic("sqlstore: bad migration file name " + e.Name())
		}
		body, err := fs.ReadFile(migrationFiles, path.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out
}

// Render expands a migration's template for n: its fields, and the functions quote
// (an identifier) and idx (the name of one of the outbox's indexes).
func Render(d Dialect, m Migration, n *Names) (string, error) {
	t, err := template.New(m.Name).Funcs(template.FuncMap{
		"quote": d.Quote,
		"idx":   func(suffix string) string { return d.Quote(n.Prefix + "_" + suffix) },
	}).Parse(m.SQL)
	if err != nil {
		return "", fmt.Errorf("parsing migration %d: %w", m.Version, err)
	}
	var b strings.Builder
	if err := t.Execute(&b, n); err != nil {
		return "", fmt.Errorf("rendering migration %d: %w", m.Version, err)
	}
	return b.String(), nil
}

// books is a dialect's bookkeeping of the migrations applied to an outbox.
type books struct {
	// schema creates n.Schema if it is missing; "" when there is none to create.
	schema string
	// table creates the applied-migrations table if it is missing.
	table string
	// now is the clock that dates a migration.
	now string
}

// record is the statement that records m as applied. Its values are spliced: a version is
// an integer and a name is checked at load (migrationName).
func (b books) record(n *Names, m Migration) string {
	return fmt.Sprintf("INSERT INTO %s (version, name, applied_at) VALUES (%d, '%s', %s)", n.Migrations, m.Version, m.Name, b.now)
}

// runMigrations applies, inside the caller's transaction q, every migration of d not yet
// recorded in n.Migrations.
func runMigrations(ctx context.Context, d Dialect, q Querier, n *Names) error {
	b := d.sql().books(n)
	if b.schema != "" {
		if err := q.Exec(ctx, b.schema); err != nil {
			return fmt.Errorf("creating the schema of %s: %w", n.Outbox, err)
		}
	}
	if err := q.Exec(ctx, b.table); err != nil {
		return fmt.Errorf("creating %s: %w", n.Migrations, err)
	}
	done, err := appliedVersions(ctx, q, n)
	if err != nil {
		return err
	}
	for _, m := range d.Migrations() {
		if done[m.Version] {
			continue
		}
		sql, err := Render(d, m, n)
		if err != nil {
			return err
		}
		if err := q.Exec(ctx, sql); err != nil {
			return fmt.Errorf("outbox: migration %d (%s): %w", m.Version, m.Name, err)
		}
		if err := q.Exec(ctx, b.record(n, m)); err != nil {
			return err
		}
	}
	return nil
}

// appliedVersions reads the versions recorded in n.Migrations.
func appliedVersions(ctx context.Context, q Querier, n *Names) (map[int]bool, error) {
	rows, err := q.Query(ctx, "SELECT version FROM "+n.Migrations)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}

// statements runs a multi-statement script (a migration) one statement at a time, for
// drivers that run one per call (MySQL's, SQLite's).
type statements struct{ Querier }

func (q statements) Exec(ctx context.Context, query string, args ...any) error {
	if len(args) > 0 {
		return q.Querier.Exec(ctx, query, args...)
	}
	for _, stmt := range splitStatements(query) {
		if err := q.Querier.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// splitStatements cuts a migration into statements: a statement ends with a line whose last
// character is ';'. Comment-only chunks are dropped.
func splitStatements(script string) []string {
	var (
		out []string
		cur strings.Builder
	)
	flush := func() {
		stmt := strings.TrimSpace(cur.String())
		cur.Reset()
		for _, line := range strings.Split(stmt, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
				out = append(out, strings.TrimSuffix(stmt, ";"))
				return
			}
		}
	}
	for line := range strings.SplitSeq(script, "\n") {
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(strings.TrimRight(line, " \t\r"), ";") {
			flush()
		}
	}
	flush()
	return out
}
