package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/outbox"
)

// This file holds what an operator asks of an outbox beyond the relay's and the consumers'
// own statements: its schema's state, who holds leases, what the dead letters are made of.
// The outbox's backlog and lag are readStats, shared with the relay's gauges.

// opsSQL is what the operator's queries need of a dialect.
type opsSQL struct {
	// now is the database clock.
	now string
	// bucket is the start, in whole seconds since 1970, of the interval of secs seconds
	// (an integer literal) that the time column col falls in.
	bucket func(col, secs string) string
	// bindTime binds a time compared with the dead-letter table's failure times.
	bindTime func(time.Time) any
	// rebind turns "?" placeholders into the dialect's.
	rebind func(string) string
	// tableExists returns the query (with its arguments) that returns a row when the
	// table called name, in n's schema, exists.
	tableExists func(n *Names, name string) (string, []any)
}

func (postgres) ops() opsSQL {
	return opsSQL{
		now: "now()",
		bucket: func(col, secs string) string {
			return "floor(extract(epoch FROM " + col + ") / " + secs + ")::bigint * " + secs
		},
		bindTime: func(t time.Time) any { return t },
		rebind: func(q string) string {
			var b strings.Builder
			n := 0
			for _, r := range q {
				if r == '?' {
					n++
					b.WriteString("$" + strconv.Itoa(n))
					continue
				}
				b.WriteRune(r)
			}
			return b.String()
		},
		tableExists: func(n *Names, name string) (string, []any) {
			qualified := postgres{}.Quote(name)
			if n.Schema != "" {
				qualified = postgres{}.Quote(n.Schema) + "." + qualified
			}
			return "SELECT 1 WHERE to_regclass($1) IS NOT NULL", []any{qualified}
		},
	}
}

func (mysqlDialect) ops() opsSQL {
	return opsSQL{
		now: mysqlNow,
		bucket: func(col, secs string) string {
			return "TIMESTAMPDIFF(SECOND, '1970-01-01 00:00:00', " + col + ") DIV " + secs + " * " + secs
		},
		bindTime: mysqlConsumer.failTime,
		rebind:   func(q string) string { return q },
		tableExists: func(n *Names, name string) (string, []any) {
			var schema any
			if n.Schema != "" {
				schema = n.Schema
			}
			return "SELECT 1 FROM information_schema.tables WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?", []any{schema, name}
		},
	}
}

func (sqliteDialect) ops() opsSQL {
	return opsSQL{
		now: sqliteNow,
		bucket: func(col, secs string) string {
			return "CAST(strftime('%s', " + col + ") AS INTEGER) / " + secs + " * " + secs
		},
		bindTime: sqliteConsumer.failTime,
		rebind:   func(q string) string { return q },
		tableExists: func(n *Names, name string) (string, []any) {
			master := "sqlite_master"
			if n.Schema != "" {
				master = SQLite.Quote(n.Schema) + ".sqlite_master"
			}
			return "SELECT 1 FROM " + master + " WHERE type = 'table' AND name = ?", []any{name}
		},
	}
}

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
	query, args := d.ops().tableExists(n, n.Prefix+"_migrations")
	exists, err := scanOne(ctx, q, nil, query, args...)
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
	b := d.books(n)
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
		return ClassifyUnavailable(err)
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
			name := d.Quote(n.Prefix + t.suffix)
			if n.Schema != "" {
				name = d.Quote(n.Schema) + "." + name
			}
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

// Lease is what one relay holds of an outbox.
type Lease struct {
	Owner string
	// Rows counts the rows it holds; Until is when its last lease expires.
	Rows  int64
	Until time.Time
}

// Leases returns the live leases on n's outbox by owner, and the database's clock.
func Leases(ctx context.Context, d Dialect, q Querier, n *Names) ([]Lease, time.Time, error) {
	o := d.ops()
	rows, err := q.Query(ctx, "SELECT lease_owner, count(*), max(lease_until), "+o.now+" FROM "+n.Outbox+
		" WHERE lease_until > "+o.now+" GROUP BY lease_owner ORDER BY lease_owner")
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("reading the leases of %s: %w", n.Outbox, err)
	}
	defer rows.Close()
	var out []Lease
	var now anyTime
	for rows.Next() {
		var l Lease
		var owner *string
		var until anyTime
		if err := rows.Scan(&owner, &l.Rows, &until, &now); err != nil {
			return nil, time.Time{}, fmt.Errorf("reading the leases of %s: %w", n.Outbox, err)
		}
		if owner != nil {
			l.Owner = *owner
		}
		l.Until = until.t
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("reading the leases of %s: %w", n.Outbox, err)
	}
	if len(out) == 0 {
		if err := queryRow(ctx, q, []any{&now}, "SELECT "+o.now); err != nil {
			return nil, time.Time{}, fmt.Errorf("reading the database clock: %w", err)
		}
	}
	return out, now.t, nil
}

// Retrying counts the outbox rows that failed to be sent and wait for another attempt (not
// the rows held by a dead letter: see HeldKeys).
func Retrying(ctx context.Context, d Dialect, q Querier, n *Names) (int64, error) {
	o := d.ops()
	var count int64
	err := queryRow(ctx, q, []any{&count}, "SELECT count(*) FROM "+n.Outbox+
		" WHERE last_error IS NOT NULL AND (lease_until IS NULL OR lease_until <= "+o.now+") AND available_at <> "+heldAt(d))
	if err != nil {
		return 0, fmt.Errorf("counting the retrying rows of %s: %w", n.Outbox, err)
	}
	return count, nil
}

// DeadLetterGroup counts the dead letters that share a status, stage, kind, event type and
// consumer.
type DeadLetterGroup struct {
	Status, Stage, Kind, EventType, Consumer string
	Count                                    int64
	// FirstFailedAt and LastFailedAt span the group's last failures.
	FirstFailedAt, LastFailedAt time.Time
}

// DeadLetterGroups counts n's dead letters by status, stage, kind, event type and consumer,
// in that order.
func DeadLetterGroups(ctx context.Context, d Dialect, q Querier, n *Names) ([]DeadLetterGroup, error) {
	rows, err := q.Query(ctx, "SELECT status, stage, kind, event_type, consumer, count(*), min(last_failed_at), max(last_failed_at) FROM "+
		n.DeadLetters+" GROUP BY status, stage, kind, event_type, consumer ORDER BY status, stage, kind, event_type, consumer")
	if err != nil {
		return nil, fmt.Errorf("counting the dead letters of %s: %w", n.Outbox, err)
	}
	defer rows.Close()
	var out []DeadLetterGroup
	for rows.Next() {
		var g DeadLetterGroup
		var first, last anyTime
		if err := rows.Scan(&g.Status, &g.Stage, &g.Kind, &g.EventType, &g.Consumer, &g.Count, &first, &last); err != nil {
			return nil, fmt.Errorf("counting the dead letters of %s: %w", n.Outbox, err)
		}
		g.FirstFailedAt, g.LastFailedAt = first.t, last.t
		out = append(out, g)
	}
	return out, rows.Err()
}

// DeadLetterBucket counts the dead letters of one kind that last failed in one interval.
type DeadLetterBucket struct {
	Kind  string
	Start time.Time
	Count int64
}

// DeadLetterHistory counts n's dead letters (whatever their status) by kind and by the
// interval of width step, aligned on the Unix epoch, in which they last failed, from since
// on. Intervals without any are left out.
func DeadLetterHistory(ctx context.Context, d Dialect, q Querier, n *Names, since time.Time, step time.Duration) ([]DeadLetterBucket, error) {
	secs := int64(step / time.Second)
	if secs < 1 {
		return nil, fmt.Errorf("outbox: dead-letter history step %v is under a second", step)
	}
	o := d.ops()
	s := strconv.FormatInt(secs, 10)
	rows, err := q.Query(ctx, o.rebind("SELECT kind, "+o.bucket("last_failed_at", s)+", count(*) FROM "+
		n.DeadLetters+" WHERE last_failed_at >= ? GROUP BY 1, 2 ORDER BY 2, 1"), o.bindTime(since))
	if err != nil {
		return nil, fmt.Errorf("reading the dead-letter history of %s: %w", n.Outbox, err)
	}
	defer rows.Close()
	var out []DeadLetterBucket
	for rows.Next() {
		var b DeadLetterBucket
		var start int64
		if err := rows.Scan(&b.Kind, &start, &b.Count); err != nil {
			return nil, fmt.Errorf("reading the dead-letter history of %s: %w", n.Outbox, err)
		}
		b.Start = time.Unix(start, 0).UTC()
		out = append(out, b)
	}
	return out, rows.Err()
}
