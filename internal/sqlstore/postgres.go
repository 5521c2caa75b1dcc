package sqlstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Postgres is the PostgreSQL dialect (12 and later). Its relay store is postgres_store.go,
// its claim the function of migration 004 (postgres_claim.go calls it), its inbox
// postgres_inbox.go.
var Postgres Dialect = postgres{pgSQL}

type postgres struct{ *dialectSQL }

func (postgres) Name() string { return "postgres" }

func (postgres) Quote(ident string) string { return pgQuote(ident) }

func pgQuote(ident string) string { return `"` + ident + `"` }

func (postgres) Migrations() []Migration { return loadMigrations("postgres") }

// Migrate runs the pending migrations in one transaction (PostgreSQL's DDL is
// transactional), under an advisory lock that keeps concurrent migrators apart.
func (d postgres) Migrate(ctx context.Context, db DB, n *Names) error {
	return db.InTx(ctx, func(q Querier) error {
		if err := q.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", n.MigrateKey); err != nil {
			return err
		}
		return runMigrations(ctx, d, q, n)
	})
}

func (d postgres) Store(db DB, n *Names) outboxdriver.Store {
	return classified(d, db, n, &pgStore{db: db, n: n})
}

func (d postgres) DeadLetters(db DB, n *Names) deadletter.Table { return newDeadLetters(d, db, n) }

var pgInserts sync.Map // "table/rows" → statement

// pgInsertSQL builds (and caches) an INSERT of rows messages.
func pgInsertSQL(table string, rows int) string {
	key := table + "/" + strconv.Itoa(rows)
	if s, ok := pgInserts.Load(key); ok {
		return s.(string)
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " " + insertColumns + " VALUES ")
	for r := range rows {
		if r > 0 {
			b.WriteByte(',')
		}
		o := r * 7
		fmt.Fprintf(&b, "($%d::uuid,$%d,$%d,$%d::jsonb,$%d,$%d,$%d)", o+1, o+2, o+3, o+4, o+5, o+6, o+7)
	}
	s := b.String()
	pgInserts.Store(key, s)
	return s
}

// pgMaxInsertRows keeps one multi-row INSERT under PostgreSQL's 65535 parameters.
const pgMaxInsertRows = 1000

func (postgres) Insert(ctx context.Context, q Querier, n *Names, msgs []outbox.Message) error {
	for len(msgs) > 0 {
		chunk := msgs[:min(len(msgs), pgMaxInsertRows)]
		msgs = msgs[len(chunk):]
		args := make([]any, 0, 7*len(chunk))
		for _, m := range chunk {
			args = append(args, messageArgs(m)...)
		}
		if err := q.Exec(ctx, pgInsertSQL(n.Outbox, len(chunk)), args...); err != nil {
			return err
		}
	}
	return nil
}

// pgSQL is PostgreSQL's part of the SQL every dialect shares (fragments.go).
var pgSQL = &dialectSQL{
	now:         "now()",
	rebind:      numbered,
	key:         "key",
	heldAt:      "'infinity'::timestamptz",
	headers:     "coalesce(headers::text, '')",
	eventID:     "coalesce(event_id::text, '')",
	epoch:       "'epoch'::timestamptz",
	size:        func(col string) string { return "octet_length(" + col + ")" },
	uuidParam:   "?::uuid",
	jsonParam:   "?::jsonb",
	bindTime:    func(t time.Time) any { return t },
	bindCreated: func(t time.Time) any { return t },
	contains:    "strpos(reason, ?) > 0",
	ago: func(d time.Duration) (string, any) {
		return "now() - ? * interval '1 millisecond'", d.Milliseconds()
	},
	lockRows:      " FOR UPDATE",
	skipLocked:    " FOR UPDATE SKIP LOCKED",
	replayHeaders: "coalesce(headers, '{}'::jsonb) || jsonb_build_object('" + outbox.ReplayHeader + "', ?::text)",
	bucket: func(col, secs string) string {
		return "floor(extract(epoch FROM " + col + ") / " + secs + ")::bigint * " + secs
	},
	tableExists: func(n *Names, name string) (string, []any) {
		return "SELECT 1 WHERE to_regclass($1) IS NOT NULL", []any{n.table(postgres{}, name)}
	},
	dlTuple:    "(?::uuid,?,?,?::jsonb,?,?,?,?,?,?,?,?,?,?,?,?,?::bigint)",
	dlMaxRows:  1000,
	deleteSome: pgDeleteSome,
	books: func(n *Names) books {
		b := books{
			table: "CREATE TABLE IF NOT EXISTS " + n.Migrations + " (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
			now:   "now()",
		}
		if n.Schema != "" {
			b.schema = "CREATE SCHEMA IF NOT EXISTS " + pgQuote(n.Schema)
		}
		return b
	},
}

// pgDeleteSome deletes up to limit rows of table that match where (with "?" placeholders)
// by their places in the heap, and returns how many it deleted.
func pgDeleteSome(ctx context.Context, q Querier, table, where string, args []any, limit int) (int64, error) {
	var count int64
	_, err := scanRow(ctx, q, []any{&count}, numbered(`WITH gone AS (
    DELETE FROM `+table+` WHERE ctid IN (
        SELECT ctid FROM `+table+` WHERE `+where+` LIMIT ?)
    RETURNING 1)
SELECT count(*) FROM gone`), append(args, limit)...)
	return count, err
}
