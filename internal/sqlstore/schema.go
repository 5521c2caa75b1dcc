package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/txoutbox/outbox"
)

// This file reads what state an outbox's schema is in, for the operator (outbox migrate
// --check, --script) and for the relay before its first claim (Validate).

// MigrationState is which of a dialect's migrations an outbox has.
type MigrationState struct {
	// Applied are the versions recorded, known to this build or not.
	Applied []int
	// Pending are the migrations of this build not applied yet, in order.
	Pending []Migration
	// Unknown are applied versions this build does not have: the database was migrated
	// by a newer release.
	Unknown []int
}

// Migrations reads which of d's migrations n has. Nothing is created: a database without
// the applied-migrations table has every migration pending.
func Migrations(ctx context.Context, d Dialect, q Querier, n *Names) (MigrationState, error) {
	var st MigrationState
	query, args := d.sql().tableExists(n, n.Prefix+"_migrations")
	exists, err := scanRow(ctx, q, nil, query, args...)
	if err != nil {
		return st, fmt.Errorf("looking for %s: %w", n.Migrations, err)
	}
	done := map[int]bool{}
	if exists {
		if done, err = appliedVersions(ctx, q, n); err != nil {
			return st, fmt.Errorf("reading %s: %w", n.Migrations, err)
		}
	}
	known := map[int]bool{}
	for _, m := range d.Migrations() {
		known[m.Version] = true
		if !done[m.Version] {
			st.Pending = append(st.Pending, m)
		}
	}
	for v := range done {
		st.Applied = append(st.Applied, v)
		if !known[v] {
			st.Unknown = append(st.Unknown, v)
		}
	}
	slices.Sort(st.Applied)
	slices.Sort(st.Unknown)
	return st, nil
}

// MigrationScript renders ms for n as one SQL script that a migration tool (goose, atlas,
// Flyway…) can run: the schema if n has one, the applied-migrations table, then each
// migration followed by the statement that records it, so that Migrate later finds them
// applied and runs only what comes after.
func MigrationScript(d Dialect, n *Names, ms []Migration) (string, error) {
	b := d.sql().books(n)
	var out strings.Builder
	if b.schema != "" {
		out.WriteString(b.schema + ";\n\n")
	}
	out.WriteString(b.table + ";\n")
	for _, m := range ms {
		sql, err := Render(d, m, n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&out, "\n-- migration %d: %s\n%s\n", m.Version, m.Name, strings.TrimSpace(sql))
		out.WriteString(b.record(n, m) + ";\n")
	}
	return out.String(), nil
}

// tableColumns are the columns each table of an outbox must have, by its name's suffix.
var tableColumns = []struct {
	suffix  string
	columns []string
}{
	{"", []string{"seq", "id", "type", "key", "headers", "content_type", "body", "created_at", "available_at",
		"attempts", "claim_token", "lease_owner", "lease_until", "first_failed_at", "last_error"}},
	{"_dead_letters", []string{"id", "event_id", "event_type", "event_key", "headers", "content_type", "body",
		"created_at", "stage", "kind", "consumer", "reason", "attempts", "first_failed_at", "last_failed_at",
		"status", "status_changed_at", "broker_message_id", "raw", "held_seq"}},
	{"_inbox", []string{"consumer", "event_id", "processed_at"}},
	{"_http_responses", []string{"consumer", "event_id", "request_hash", "status", "headers", "body", "processed_at"}},
	{"_scheduled", []string{"seq", "id", "type", "key", "headers", "content_type", "body", "created_at", "deliver_at"}},
}

// ErrSchema is outbox.ErrSchema, which [Validate] wraps.
var ErrSchema = outbox.ErrSchema

// Validate checks that n's tables are those this build of d expects: every migration
// applied, none unknown, and every table with the columns the library reads and writes.
// It changes nothing. The error wraps [ErrSchema] and names every problem.
//
// A database that cannot be reached fails it with an error marked outbox.Unavailable, and
// a cancelled ctx with ctx's error, never with ErrSchema: a relay retries the one and stops
// on the other.
func Validate(ctx context.Context, d Dialect, q Querier, n *Names) error {
	st, err := Migrations(ctx, d, q, n)
	if err != nil {
		return classifyUnavailable(err)
	}
	var problems []error
	for _, m := range st.Pending {
		problems = append(problems, fmt.Errorf("migration %d (%s) is not applied", m.Version, m.Name))
	}
	for _, v := range st.Unknown {
		problems = append(problems, fmt.Errorf("migration %d is applied but unknown to this version: the database was migrated by a newer release", v))
	}
	if len(st.Pending) == 0 {
		for _, t := range tableColumns {
			name := n.table(d, n.Prefix+t.suffix)
			// Qualified: SQLite reads an unqualified double-quoted name that is no column
			// as a string.
			cols := make([]string, len(t.columns))
			for i, c := range t.columns {
				cols[i] = "t." + d.Quote(c)
			}
			rows, err := q.Query(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+name+" AS t WHERE 1 = 0")
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			switch {
			case err == nil:
			case ctx.Err() != nil: // cancelled, not a problem of the schema
				return fmt.Errorf("validating %s: %w", n.Outbox, err)
			case databaseUnavailable(err):
				return outbox.Unavailable(fmt.Errorf("validating %s: %w", n.Outbox, err))
			default:
				problems = append(problems, fmt.Errorf("table %s: %w", name, err))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s: %w", ErrSchema, n.Outbox, errors.Join(problems...))
	}
	return nil
}
