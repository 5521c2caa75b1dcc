// Package sqlstoretest gives the database/sql-based adapters' tests (GORM, bun,
// database/sql) a fresh outbox per test on a real PostgreSQL, MariaDB/MySQL or SQLite, and
// the conformance-suite fixture over it. It imports no driver: each test opens the database
// with its own.
package sqlstoretest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
)

// PostgresURL is TXOUTBOX_PG_URL or the local test database.
func PostgresURL() string { return outboxtest.PostgresURL() }

// MySQLDSN is TXOUTBOX_MYSQL_DSN or the local test database (go-sql-driver/mysql form).
func MySQLDSN() string { return outboxtest.MySQLDSN() }

// SQLiteDSN is a new database file in dir, in WAL mode with a busy timeout (the pragma syntax
// of modernc.org/sqlite and its forks).
func SQLiteDSN(dir string) string {
	// '#' and '?' would end the path of the file: URI (subtests with the same name get
	// a '#' in their temporary directory).
	path := strings.NewReplacer("%", "%25", "#", "%23", "?", "%3F").Replace(filepath.Join(dir, "outbox.db"))
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"
}

// Target is one test's database and outbox names: a schema of its own on PostgreSQL,
// tables with a prefix of their own on MySQL, a file of its own on SQLite. Everything is
// dropped when the test ends.
type Target struct {
	DB      *sql.DB
	Dialect string // "postgres", "mysql" or "sqlite"
	DSN     string
	Tables  outbox.Tables
	names   *sqlstore.Names
	tables  []string // business tables to drop (MySQL)
}

// New opens a database of dialect with open(dsn), checks it answers (a missing service
// fails the test under CI and skips it otherwise) and picks fresh outbox names. The outbox
// is not migrated.
func New(t testing.TB, dialect string, open func(dsn string) (*sql.DB, error)) *Target {
	t.Helper()
	d, err := sqlstore.Lookup(dialect)
	if err != nil {
		t.Fatal(err)
	}
	var dsn, service string
	switch dialect {
	case "postgres":
		dsn, service = PostgresURL(), "PostgreSQL"
	case "mysql":
		dsn, service = MySQLDSN(), "MySQL/MariaDB"
	case "sqlite":
		dsn, service = SQLiteDSN(t.TempDir()), "SQLite"
	}
	db, err := open(dsn)
	if err == nil {
		if err = db.PingContext(context.Background()); err != nil {
			db.Close()
		}
	}
	outboxtest.RequireService(t, service, err)
	tg := &Target{DB: db, Dialect: dialect, DSN: dsn}
	suffix := fmt.Sprintf("%012x", rand.Uint64()>>16)
	switch dialect {
	case "postgres":
		tg.Tables = outbox.Tables{Schema: "t_" + suffix}
	case "mysql":
		tg.Tables = outbox.Tables{Outbox: "ob_" + suffix}
	}
	if tg.names, err = sqlstore.NewNames(d, tg.Tables); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tg.Unmigrate(context.Background())
		db.Close()
	})
	return tg
}

// Unmigrate drops the outbox: its schema (PostgreSQL), or its tables and the test's
// business tables (MySQL, SQLite), as if it had never been migrated.
func (tg *Target) Unmigrate(ctx context.Context) error {
	if tg.Dialect == "postgres" {
		_, err := tg.DB.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+tg.Tables.Schema+" CASCADE")
		return err
	}
	n := tg.names
	var errs []error
	for _, table := range append([]string{n.Outbox, n.DeadLetters, n.Migrations, n.ClaimLock, n.Inbox, n.Responses, n.Scheduled}, tg.tables...) {
		if _, err := tg.DB.ExecContext(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Table returns the qualified name of a business table of this test (created by the test,
// dropped with the outbox).
func (tg *Target) Table(name string) string {
	switch tg.Dialect {
	case "postgres":
		return tg.Tables.Schema + "." + name
	case "mysql":
		table := tg.Tables.Outbox + "_" + name
		tg.tables = append(tg.tables, "`"+table+"`")
		return table
	}
	return name
}

// OutboxTable is the qualified, quoted outbox table.
func (tg *Target) OutboxTable() string { return tg.names.Outbox }

// MigrationsTable is the qualified, quoted table of applied migrations.
func (tg *Target) MigrationsTable() string { return tg.names.Migrations }

// Pending counts the outbox's rows.
func (tg *Target) Pending(ctx context.Context) (int, error) {
	var n int
	err := tg.DB.QueryRowContext(ctx, "SELECT count(*) FROM "+tg.names.Outbox).Scan(&n)
	return n, err
}

// DeadLetters reads the dead-letter table (uuid.Nil for an entry without an event ID).
func (tg *Target) DeadLetters(ctx context.Context) ([]outboxtest.DeadLetterRow, error) {
	rows, err := tg.DB.QueryContext(ctx, "SELECT COALESCE(CAST(event_id AS CHAR(36)), ''), stage, reason, attempts FROM "+tg.names.DeadLetters+" ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outboxtest.DeadLetterRow
	for rows.Next() {
		var (
			r  outboxtest.DeadLetterRow
			id string
		)
		if err := rows.Scan(&id, &r.Stage, &r.Reason, &r.Attempts); err != nil {
			return nil, err
		}
		if id != "" {
			if r.EventID, err = uuid.Parse(id); err != nil {
				return nil, err
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Migrated reports whether the outbox table exists, and how many migrations are recorded.
func (tg *Target) Migrated(ctx context.Context) (exists bool, versions int, err error) {
	if _, err := tg.Pending(ctx); err != nil {
		return false, 0, nil
	}
	err = tg.DB.QueryRowContext(ctx, "SELECT count(*) FROM "+tg.names.Migrations).Scan(&versions)
	return true, versions, err
}

// Versions is how many migrations the dialect has.
func (tg *Target) Versions() int {
	d, _ := sqlstore.Lookup(tg.Dialect)
	return len(d.Migrations())
}

// DefaultNames reports whether the outbox has the default table names (SQLite, whose
// database is a file of the test's own), so the adapters' package-level functions reach it.
func (tg *Target) DefaultNames() bool { return tg.Tables == outbox.Tables{} }

// Rebind turns the '?' placeholders of query into PostgreSQL's $1, $2… on PostgreSQL.
func (tg *Target) Rebind(query string) string {
	if tg.Dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r != '?' {
			b.WriteRune(r)
			continue
		}
		n++
		fmt.Fprintf(&b, "$%d", n)
	}
	return b.String()
}

// EffectsTable creates the idempotency suite's effects table, (id, text) with no unique key
// so that a duplicate effect shows, and returns its name.
func (tg *Target) EffectsTable(t testing.TB) string {
	t.Helper()
	table := tg.Table("effects")
	if _, err := tg.DB.ExecContext(context.Background(), "CREATE TABLE "+table+" (id CHAR(36) NOT NULL, text VARCHAR(255) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return table
}

// CountByText counts table's rows by their text column.
func (tg *Target) CountByText(ctx context.Context, table string) (map[string]int, error) {
	rows, err := tg.DB.QueryContext(ctx, "SELECT text, count(*) FROM "+table+" GROUP BY text")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var text string
		var n int
		if err := rows.Scan(&text, &n); err != nil {
			return nil, err
		}
		out[text] = n
	}
	return out, rows.Err()
}

// AgeInbox moves the recording time of every inbox row and stored HTTP response d into the
// past.
func (tg *Target) AgeInbox(ctx context.Context, d time.Duration) error {
	for _, table := range []string{tg.names.Inbox, tg.names.Responses} {
		var query string
		var arg any
		switch tg.Dialect {
		case "postgres":
			query, arg = "UPDATE "+table+" SET processed_at = processed_at - $1 * interval '1 millisecond'", d.Milliseconds()
		case "mysql":
			query, arg = "UPDATE "+table+" SET processed_at = processed_at - INTERVAL ? MICROSECOND", d.Microseconds()
		default:
			query, arg = "UPDATE "+table+" SET processed_at = strftime('%Y-%m-%d %H:%M:%f', processed_at, ?)", fmt.Sprintf("%+.3f seconds", -d.Seconds())
		}
		if _, err := tg.DB.ExecContext(ctx, query, arg); err != nil {
			return err
		}
	}
	return nil
}

// Fixture is the conformance suite's fixture over store, with publish writing through the
// adapter under test. The adapter's test sets PublishNilTx.
func (tg *Target) Fixture(store outboxdriver.Store, publish func(ctx context.Context, commit bool, events ...outbox.Encodable) error) *outboxtest.StoreFixture {
	d, _ := sqlstore.Lookup(tg.Dialect)
	cd, _ := sqlstore.Consumer(d)
	return &outboxtest.StoreFixture{
		Store:           store,
		Publish:         publish,
		Pending:         tg.Pending,
		DeadLetters:     tg.DeadLetters,
		SingleRelay:     tg.Dialect == "sqlite",
		DeadLetterTable: cd.DeadLetters(sqlstore.StdDB(tg.DB), tg.names),
		SQL:             tg.RawSQL(),
		Unmigrate:       tg.Unmigrate,
	}
}

// RawSQL reaches the outbox's tables with raw SQL, for the suites' poison tests.
func (tg *Target) RawSQL() *outboxtest.RawSQL {
	r := &outboxtest.RawSQL{
		Dialect: tg.Dialect,
		Exec: func(ctx context.Context, query string) error {
			_, err := tg.DB.ExecContext(ctx, query)
			return err
		},
		Outbox:      tg.names.Outbox,
		DeadLetters: tg.names.DeadLetters,
	}
	if tg.Dialect != "sqlite" { // a file, no server: no connection to drop
		r.Lock, r.KillWaiting = tg.lock, tg.killWaiting
	}
	return r
}

// lock locks the outbox table on a connection of its own (see outboxtest.RawSQL.Lock).
func (tg *Target) lock(ctx context.Context) (func(), error) {
	var lock []string
	var unlock string
	switch tg.Dialect {
	case "postgres":
		lock, unlock = []string{"BEGIN", "LOCK TABLE " + tg.names.Outbox + " IN ACCESS EXCLUSIVE MODE"}, "ROLLBACK"
	case "mysql":
		lock, unlock = []string{"LOCK TABLES " + tg.names.Outbox + " WRITE"}, "UNLOCK TABLES"
	default:
		return nil, fmt.Errorf("sqlstoretest: no lock for %s", tg.Dialect)
	}
	conn, err := tg.DB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	for _, stmt := range lock {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return func() {
		_, _ = conn.ExecContext(context.Background(), unlock)
		conn.Close()
	}, nil
}

// killWaiting terminates the connections that wait for lock's lock: on PostgreSQL those
// waiting for a lock on this test's outbox table, on MySQL those whose statement names it
// (its table prefix is the test's own) and that wait for a table lock.
func (tg *Target) killWaiting(ctx context.Context) (int, error) {
	switch tg.Dialect {
	case "postgres":
		var n int
		err := tg.DB.QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
 WHERE NOT granted AND relation = $1::regclass AND pid <> pg_backend_pid()`, tg.names.Outbox).Scan(&n)
		return n, err
	case "mysql":
		rows, err := tg.DB.QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND STATE LIKE 'Waiting for table%' AND LOCATE(?, INFO) > 0", tg.Tables.Outbox)
		if err != nil {
			return 0, err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, err
			}
			ids = append(ids, id)
		}
		rows.Close()
		for _, id := range ids {
			if _, err := tg.DB.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
				return 0, err
			}
		}
		return len(ids), rows.Err()
	}
	return 0, fmt.Errorf("sqlstoretest: no connections to kill on %s", tg.Dialect)
}

// ErrRollback is what fixtures' Publish functions return from a transaction to roll it back.
var ErrRollback = rollback{}

type rollback struct{}

func (rollback) Error() string { return "rolled back on purpose" }

// Variant is one way of running a producer transaction, for [CompareProducers].
type Variant struct {
	Name string
	Tx   func(ctx context.Context) error
}

// CompareProducers measures variants side by side: rounds rounds, each running every
// variant in turn for round from clients goroutines, so neighbours' load and the table's
// growth hit all variants alike. It reports each variant's wall time per transaction
// ("<name>_ns/op", all clients together) and the last variant's throughput relative to each
// other one ("<last>/<other>"). It ignores b.N: run it with -benchtime 1x.
func CompareProducers(b *testing.B, clients int, round time.Duration, rounds int, variants ...Variant) {
	b.Helper()
	ctx := context.Background()
	ops := make([]int64, len(variants))
	spent := make([]time.Duration, len(variants))
	for range rounds {
		for i, v := range variants {
			var n atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			deadline := start.Add(round)
			for range clients {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						if err := v.Tx(ctx); err != nil {
							b.Errorf("%s: %v", v.Name, err)
							return
						}
						n.Add(1)
					}
				})
			}
			wg.Wait()
			ops[i] += n.Load()
			spent[i] += time.Since(start)
		}
	}
	nsPerOp := make([]float64, len(variants))
	for i, v := range variants {
		nsPerOp[i] = float64(spent[i].Nanoseconds()) / float64(max(ops[i], 1))
		b.ReportMetric(nsPerOp[i], v.Name+"_ns/op")
	}
	last := len(variants) - 1
	for i := range last {
		b.ReportMetric(nsPerOp[i]/nsPerOp[last], variants[last].Name+"/"+variants[i].Name)
	}
}
