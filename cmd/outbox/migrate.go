package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/txoutbox/outbox/internal/sqlstore"
)

func (a *app) migrate(ctx context.Context, args []string) error {
	fs := a.flags("migrate", "[--dry-run | --check | --script --dialect D] [flags]")
	var f dbFlags
	f.add(a, fs)
	dryRun := fs.Bool("dry-run", false, "print the SQL of the pending migrations instead of running them")
	check := fs.Bool("check", false, "check the schema (every migration applied, every column there) and exit 5 if it is not current")
	script := fs.Bool("script", false, "print the whole schema as one SQL script for a migration tool (goose, atlas, Flyway); needs --dialect, no database")
	dialect := fs.String("dialect", "", "with --script: postgres, mysql or sqlite")
	asJSON := fs.Bool("json", false, "with --check: print the result as JSON")
	var lg logFlags
	lg.add(a, fs, "also create the publication of the outbox's inserts that `outbox relay --log` reads (PostgreSQL)")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	if n := btoi(*dryRun) + btoi(*check) + btoi(*script); n > 1 {
		return usagef("--dry-run, --check and --script exclude each other")
	}
	if err := lg.check(); err != nil {
		return err
	}
	if lg.on && (*dryRun || *check || *script) {
		return usagef("--log goes with a plain migrate, not --dry-run, --check or --script")
	}
	if *script {
		return a.migrationScript(f, *dialect)
	}
	if *dialect != "" {
		return usagef("--dialect goes with --script; otherwise the database URL says it")
	}
	s, err := a.open(ctx, f, !*dryRun && !*check)
	if err != nil {
		return err
	}
	defer s.Close()
	st, err := sqlstore.Migrations(ctx, s.dialect, s.q, s.names)
	if err != nil {
		return a.stderr.hide(err)
	}
	switch {
	case *check:
		verr := s.checkSchema(ctx)
		if *asJSON {
			out := map[string]any{"outbox": s.names.Outbox, "current": verr == nil, "applied": orEmpty(st.Applied),
				"pending": versions(st.Pending), "unknown": orEmpty(st.Unknown)}
			if verr != nil {
				out["problems"] = a.stderr.redact(verr.Error())
			}
			if err := printJSON(a.stdout, out); err != nil {
				return err
			}
			if verr != nil {
				return errQuiet{exitSchema}
			}
			return nil
		}
		if verr != nil {
			return a.stderr.hide(verr)
		}
		fmt.Fprintf(a.stdout, "%s is current: migrations %s applied\n", s.describe(), list(st.Applied))
		return nil
	case *dryRun:
		if len(st.Pending) == 0 {
			fmt.Fprintf(a.stderr, "-- %s is current (migrations %s): nothing to apply\n", s.describe(), list(st.Applied))
			return nil
		}
		sql, err := sqlstore.MigrationScript(s.dialect, s.names, st.Pending)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "-- %d pending migration(s) of %s, not applied (--dry-run)\n", len(st.Pending), s.describe())
		fmt.Fprint(a.stdout, sql)
		return nil
	}
	if len(st.Unknown) > 0 {
		return fmt.Errorf("%s has migration(s) %s, unknown to this version: it was migrated by a newer release; upgrade outbox", s.describe(), list(st.Unknown))
	}
	if lg.on && s.dialect != sqlstore.Postgres {
		return usagef("--log needs PostgreSQL: the relay that reads the log uses logical replication")
	}
	if err := s.outbox.Migrate(ctx, s.db); err != nil {
		return a.stderr.hide(err)
	}
	if len(st.Pending) == 0 {
		fmt.Fprintf(a.stdout, "%s is current (migrations %s): nothing to do\n", s.describe(), list(st.Applied))
	} else {
		names := make([]string, len(st.Pending))
		for i, m := range st.Pending {
			names[i] = fmt.Sprintf("%d %s", m.Version, m.Name)
		}
		fmt.Fprintf(a.stdout, "migrated %s: applied %s\n", s.describe(), strings.Join(names, ", "))
	}
	if lg.on {
		pub := lg.publicationOf(s.names)
		if err := sqlstore.CreatePublication(ctx, s.q, s.names, pub); err != nil {
			return a.stderr.hide(err)
		}
		fmt.Fprintf(a.stdout, "publication %s of %s's inserts exists: `outbox relay --log` reads it (it creates its slot)\n", pub, s.names.Outbox)
	}
	return nil
}

// migrationScript prints every migration of a dialect as one script.
func (a *app) migrationScript(f dbFlags, dialect string) error {
	if dialect == "" {
		return usagef("--script needs --dialect postgres, mysql or sqlite")
	}
	d, err := sqlstore.Lookup(dialect)
	if err != nil {
		return usagef("--dialect: %v", err)
	}
	n, err := f.names(d)
	if err != nil {
		return err
	}
	sql, err := sqlstore.MigrationScript(d, n, d.Migrations())
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "-- txoutbox schema for %s, table %s: every migration, each recorded in %s\n", d.Name(), n.Outbox, n.Migrations)
	fmt.Fprint(a.stdout, sql)
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func versions(ms []sqlstore.Migration) []int {
	out := []int{}
	for _, m := range ms {
		out = append(out, m.Version)
	}
	return out
}

func orEmpty(v []int) []int {
	if v == nil {
		return []int{}
	}
	return v
}

// list formats versions: "1, 2, 3", or "none".
func list(v []int) string {
	if len(v) == 0 {
		return "none"
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}
