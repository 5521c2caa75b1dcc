// Package sqlstore holds the SQL behind every adapter: one dialect per database, written once
// and shared by the pgx, GORM, bun and database/sql adapters, which only translate their
// caller's connection or transaction into a [Querier].
package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"

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
	// books is the dialect's bookkeeping of applied migrations.
	books(n *Names) books
	// ops is the SQL of the operator's queries (operate.go).
	ops() opsSQL
	// Insert writes messages in the caller's transaction.
	Insert(ctx context.Context, q Querier, n *Names, msgs []outbox.Message) error
	// Store returns the relay store over db.
	Store(db DB, n *Names) outboxdriver.Store
}

// Names are a dialect's validated, quoted table names.
type Names struct {
	Schema       string // raw, validated; "" for the connection default
	Prefix       string // raw outbox table name, prefix of the others
	Outbox       string // quoted, qualified
	DeadLetters  string
	Inbox        string
	Responses    string // the HTTP Idempotency-Key responses
	Migrations   string
	ClaimFunc    string // PostgreSQL: claim and complete functions
	CompleteFunc string
	IsFree       string // PostgreSQL: the function saying whether a row is due and not leased
	Lease        string // PostgreSQL: the function leasing the rows a claim picked
	ClaimLocks   string // PostgreSQL: the function taking the claims' locks of key partitions
	WriteBacks   string // PostgreSQL: the function taking every claims' lock for a write-back
	ClaimLock    string // MySQL: the one-row table whose row lock serialises claims
	LockKey      int64  // advisory lock key of this outbox's claims (PostgreSQL: of all keys; XOR 1-16, of a key partition)
	MigrateKey   int64  // advisory lock key of this outbox's migrations
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// NewNames validates t and quotes its names for d.
func NewNames(d Dialect, t outbox.Tables) (*Names, error) {
	if t.Outbox == "" {
		t.Outbox = "outbox"
	}
	var errs []error
	if t.Schema != "" && (!identRe.MatchString(t.Schema) || len(t.Schema) > 63) {
		errs = append(errs, fmt.Errorf("outbox: schema name %q is not a plain identifier of at most 63 characters", t.Schema))
	}
	if !identRe.MatchString(t.Outbox) || len(t.Outbox) > 40 {
		errs = append(errs, fmt.Errorf("outbox: table name %q is not a plain identifier of at most 40 characters", t.Outbox))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	qual := func(name string) string {
		if t.Schema == "" {
			return d.Quote(name)
		}
		return d.Quote(t.Schema) + "." + d.Quote(name)
	}
	return &Names{
		Schema:       t.Schema,
		Prefix:       t.Outbox,
		Outbox:       qual(t.Outbox),
		DeadLetters:  qual(t.Outbox + "_dead_letters"),
		Inbox:        qual(t.Outbox + "_inbox"),
		Responses:    qual(t.Outbox + "_http_responses"),
		Migrations:   qual(t.Outbox + "_migrations"),
		ClaimFunc:    qual(t.Outbox + "_claim"),
		CompleteFunc: qual(t.Outbox + "_complete"),
		IsFree:       qual(t.Outbox + "_is_free"),
		Lease:        qual(t.Outbox + "_lease"),
		ClaimLocks:   qual(t.Outbox + "_claim_locks"),
		WriteBacks:   qual(t.Outbox + "_write_back_locks"),
		ClaimLock:    qual(t.Outbox + "_claim_lock"),
		LockKey:      lockKey(d.Name(), t.Schema, t.Outbox, "claim"),
		MigrateKey:   lockKey(d.Name(), t.Schema, t.Outbox, "migrate"),
	}, nil
}

// Index returns the quoted, unqualified name of one of this outbox's indexes.
func (n *Names) Index(d Dialect, suffix string) string { return d.Quote(n.Prefix + "_" + suffix) }

func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return int64(h.Sum64())
}

// Migration is one versioned schema change; SQL is a text/template over [Names].
type Migration struct {
	Version int
	Name    string
	SQL     string
}
