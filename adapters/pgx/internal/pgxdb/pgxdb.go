// Package pgxdb adapts pgx's handles to the interfaces of internal/sqlstore, for outboxpgx
// and outboxpglog.
package pgxdb

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txoutbox/outbox/internal/sqlstore"
)

// DB is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx: what executes statements and begins
// transactions.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Querier adapts anything that executes pgx statements to sqlstore.Querier.
type Querier struct {
	Q interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	}
}

func (q Querier) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := q.Q.Exec(ctx, sql, args...)
	return err
}

func (q Querier) Query(ctx context.Context, sql string, args ...any) (sqlstore.Rows, error) {
	rows, err := q.Q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// Pool adds transactions to Querier.
type Pool struct{ DB DB }

func (p Pool) Exec(ctx context.Context, sql string, args ...any) error {
	return Querier{p.DB}.Exec(ctx, sql, args...)
}

func (p Pool) Query(ctx context.Context, sql string, args ...any) (sqlstore.Rows, error) {
	return Querier{p.DB}.Query(ctx, sql, args...)
}

func (p Pool) InTx(ctx context.Context, fn func(sqlstore.Querier) error) (err error) {
	tx, err := p.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
		}
	}()
	if err = fn(Querier{tx}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func ignoreClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}
