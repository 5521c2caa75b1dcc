package sqlstore

import (
	"context"
	"database/sql"
	"errors"
)

// StdExecer is what database/sql's *sql.DB, *sql.Tx and *sql.Conn have in common; GORM's
// ConnPool has it too. The GORM, bun and database/sql adapters run every dialect through it.
type StdExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// StdQuerier adapts a database/sql executor (a transaction, normally) to [Querier].
func StdQuerier(q StdExecer) Querier { return stdQuerier{q} }

type stdQuerier struct{ q StdExecer }

func (q stdQuerier) Exec(ctx context.Context, query string, args ...any) error {
	_, err := q.q.ExecContext(ctx, query, args...)
	return err
}

func (q stdQuerier) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := q.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return stdRows{rows}, nil
}

type stdRows struct{ *sql.Rows }

func (r stdRows) Close() { _ = r.Rows.Close() }

// StdDB adapts a *sql.DB (a pool) to [DB]: the relay stores and Migrate run on it.
func StdDB(db *sql.DB) DB { return stdDB{stdQuerier{db}, db} }

type stdDB struct {
	stdQuerier
	db *sql.DB
}

func (d stdDB) InTx(ctx context.Context, fn func(Querier) error) error {
	return d.inTx(ctx, nil, fn)
}

// InTxReadCommitted runs fn in a READ COMMITTED transaction (see readCommitted).
func (d stdDB) InTxReadCommitted(ctx context.Context, fn func(Querier) error) error {
	return d.inTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, fn)
}

func (d stdDB) inTx(ctx context.Context, opts *sql.TxOptions, fn func(Querier) error) (err error) {
	tx, err := d.db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if err = fn(stdQuerier{tx}); err != nil {
		return err
	}
	return tx.Commit()
}

// StdTxDB adapts the caller's own transaction to [DB] for MigrateTx: InTx runs its function
// directly in that transaction, whose commit or rollback stays the caller's.
func StdTxDB(tx StdExecer) DB { return stdTxDB{stdQuerier{tx}} }

type stdTxDB struct{ stdQuerier }

func (d stdTxDB) InTx(ctx context.Context, fn func(Querier) error) error { return fn(d.stdQuerier) }

// readCommitted is implemented by DBs that can open a READ COMMITTED transaction. The MySQL
// store claims in one: every statement then reads the latest committed rows, as PostgreSQL's
// claim function does, and InnoDB takes no gap locks that would stall producers' inserts.
type readCommitted interface {
	InTxReadCommitted(ctx context.Context, fn func(Querier) error) error
}

// inTxReadCommitted runs fn at READ COMMITTED where db can, at its default level otherwise.
func inTxReadCommitted(ctx context.Context, db DB, fn func(Querier) error) error {
	if rc, ok := db.(readCommitted); ok {
		return rc.InTxReadCommitted(ctx, fn)
	}
	return db.InTx(ctx, fn)
}
