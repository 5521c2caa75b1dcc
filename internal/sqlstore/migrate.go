package sqlstore

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/txoutbox/outbox"
)

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
		if !ok || err != nil {
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

// Render expands a migration's template for n.
func Render(d Dialect, m Migration, n *Names) (string, error) {
	t, err := template.New(m.Name).Funcs(template.FuncMap{
		"quote": d.Quote,
		"idx":   func(s string) string { return n.Index(d, s) },
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

// runMigrations applies, inside the caller's transaction q, every migration of d not yet
// recorded in n.Migrations. createTable creates that table; record inserts (version, name).
func runMigrations(ctx context.Context, d Dialect, q Querier, n *Names, createTable, record string) error {
	if err := q.Exec(ctx, createTable); err != nil {
		return fmt.Errorf("creating %s: %w", n.Migrations, err)
	}
	rows, err := q.Query(ctx, "SELECT version FROM "+n.Migrations)
	if err != nil {
		return err
	}
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		done[v] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
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
		if err := q.Exec(ctx, record, m.Version, m.Name); err != nil {
			return err
		}
	}
	return nil
}

func sortBySeq(c []outbox.Claimed) {
	bySeq := func(a, b outbox.Claimed) int { return cmp.Compare(a.Seq, b.Seq) }
	// Claims mostly arrive in order already: one pass to check beats sorting big structs.
	if !slices.IsSortedFunc(c, bySeq) {
		slices.SortFunc(c, bySeq)
	}
}
