// Package sqlstore holds the SQL behind every adapter: one dialect per database, written once
// and shared by the pgx, GORM, bun and database/sql adapters, which only translate their
// caller's connection or transaction into a [Querier]. It is internal to this repository's
// adapters; a store for another database implements package outboxdriver instead.
//
// Its files, by concern. Shared by every dialect: names.go (validated table names),
// migrate.go and schema.go (migrations, their state, Validate), encode.go and scan.go (rows
// in and out, the one lenient time scanner), store.go (the relay store every dialect
// returns), classify.go (what a database's error means), storable.go (dead letters stored
// whatever their content), deadletters.go (the dead-letter table), writeback.go (the relay's
// move of rows to it), hold.go and keyhold.go (held keys: the relay's and the consumer's),
// consumer.go and inbox.go (the inbox), stats.go, publish.go, operate.go and dlview.go (the
// operator's queries), stdlib.go (database/sql). The shared SQL is written with "?"
// placeholders and the fragments each dialect gives it (fragments.go). Each dialect's own SQL
// is beside it: postgres*.go with migrations/postgres (its claim is the function of
// migration 004, called by postgres_store.go with the state postgres_claim.go keeps),
// mysql*.go and sqlite*.go with theirs; MySQL's and SQLite's claims are Go code that plans
// runs of keys in runs.go, on the write-backs of leasestore.go. Why per-key order holds is
// argued once, in docs/ordering.md.
package sqlstore

import (
	"context"
	"fmt"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Querier runs statements: a pool, a connection or a transaction, whatever the adapter has.
type Querier interface {
	Exec(ctx context.Context, query string, args ...any) error
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Rows is the subset of pgx.Rows / *sql.Rows the dialects read.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// DB is a Querier that can also run a function in a transaction.
type DB interface {
	Querier
	InTx(ctx context.Context, fn func(Querier) error) error
}

// Dialect is the SQL of one database.
type Dialect interface {
	Name() string
	// Quote quotes a validated identifier.
	Quote(ident string) string
	// Migrations returns the dialect's migrations in version order.
	Migrations() []Migration
	// Migrate runs the pending migrations on db.
	Migrate(ctx context.Context, db DB, n *Names) error
	// Insert writes messages in the caller's transaction.
	Insert(ctx context.Context, q Querier, n *Names, msgs []outbox.Message) error
	// Store returns the relay store over db.
	Store(db DB, n *Names) outboxdriver.Store
	// sql is the dialect's part of the SQL every dialect shares (fragments.go).
	sql() *dialectSQL
}

// Lookup returns the dialect named name: "postgres", "mysql" or "sqlite".
func Lookup(name string) (Dialect, error) {
	for _, d := range Dialects {
		if d.Name() == name {
			return d, nil
		}
	}
	return nil, fmt.Errorf("outbox: no SQL dialect %q (have postgres, mysql, sqlite)", name)
}

// Dialects are every dialect, for adapters that learn theirs from the caller's connection.
var Dialects = []Dialect{Postgres, MySQL, SQLite}
