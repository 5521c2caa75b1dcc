package sqlstore

import (
	"context"

	"github.com/txoutbox/outbox/outboxdriver"
)

// leaseStore is what the relay stores of MySQL and SQLite share, whose claims are Go code
// (mysql_store.go, sqlite_store.go) planning runs of keys (runs.go): the write-backs that
// carry no value per row, as plain statements, and the parts of the dead-letter write-back
// that do not depend on the dialect. PostgreSQL's store (postgres_store.go) is apart: its
// claim and complete are functions of its migrations.
type leaseStore struct {
	db  DB
	n   *Names
	sql *dialectSQL
	// heads is the dialect's loose index scan over (key, seq): the first rows of at most n
	// keys, with whether each is free, in key order from start (upper) or below it
	// (!upper). Arguments: start, n.
	heads func(upper bool) string
}

func (s *leaseStore) Stats(ctx context.Context) (outboxdriver.Stats, error) {
	return readStats(ctx, s.db, s.n)
}

// Complete deletes delivered rows that still carry token.
func (s *leaseStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.db.Exec(ctx, "DELETE FROM "+s.n.Outbox+" WHERE claim_token = ? AND "+inSeqs(seqs), token)
}

// Release gives rows that still carry token back unsent, without counting the attempt.
func (s *leaseStore) Release(ctx context.Context, token int64, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.db.Exec(ctx, "UPDATE "+s.n.Outbox+
		" SET claim_token = NULL, lease_owner = NULL, lease_until = NULL, attempts = attempts - 1"+
		" WHERE claim_token = ? AND "+inSeqs(seqs), token)
}

// deadLetters moves the rows of dead that still carry token to the dead-letter table (see
// dlWriter.moveDeadLetters): take reads them inside its transaction and deletes or holds
// them (hold.go).
func (s *leaseStore) deadLetters(ctx context.Context, dead []outboxdriver.DeadLetter,
	take func(ctx context.Context, q Querier, hold, drop []int64) ([]failedRow, error)) ([]int64, error) {
	if len(dead) == 0 {
		return nil, nil
	}
	hold, drop := holdSplit(dead)
	w := dlWriter{sql: s.sql, table: s.n.DeadLetters}
	return w.moveDeadLetters(ctx, s.db, dead, func(ctx context.Context, q Querier) ([]failedRow, error) {
		return take(ctx, q, hold, drop)
	})
}

// holdRows is the statement that holds the rows of seqs (still carrying token, keyed): due
// never, leased by none, where they stand (hold.go).
func (s *leaseStore) holdRows(seqs []int64) string {
	return "UPDATE " + s.n.Outbox + " SET available_at = " + s.sql.heldAt +
		", claim_token = NULL, lease_owner = NULL, lease_until = NULL WHERE claim_token = ? AND " + s.sql.key + " <> '' AND " + inSeqs(seqs)
}

// failedColumns are the columns of a DeadLetter write-back's read, in failedRow order.
func (s *leaseStore) failedColumns() string {
	return "seq, id, type, " + s.sql.key + ", " + s.sql.headers + ", content_type, body, created_at, attempts, COALESCE(first_failed_at, " +
		s.sql.now + "), " + s.sql.now
}
