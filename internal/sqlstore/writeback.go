package sqlstore

import (
	"context"
	"fmt"

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/outboxdriver"
)

// This file is the relay's DeadLetter write-back shared by every dialect: the rows of a
// claim leave the outbox (or stay, held: hold.go) and become dead letters in one
// transaction. Each dialect's store supplies the statement that takes them.

// moveDeadLetters is the relay's DeadLetter write-back for every dialect: in one
// transaction, take reads the claim's rows (with their first and last failure times, by the
// database clock) and deletes them, or holds those of dead letters with HoldKey (see
// hold.go), and they are inserted as dead letters, a held row's with its seq. Rows are read
// leniently, so an unreadable row keeps its raw values (and holds its key like any other).
// If the table refuses the rows, the transaction is run again with their minimal forms.
func (w dlWriter) moveDeadLetters(ctx context.Context, db DB, dead []outboxdriver.DeadLetter,
	take func(ctx context.Context, q Querier) ([]failedRow, error)) ([]int64, error) {
	byseq := make(map[int64]outboxdriver.DeadLetter, len(dead))
	for _, d := range dead {
		byseq[d.Seq] = d
	}
	var moved []int64
	run := func(refused error) error {
		return inTxReadCommitted(ctx, db, func(q Querier) error {
			taken, err := take(ctx, q)
			moved = moved[:0]
			if err != nil || len(taken) == 0 {
				return err
			}
			rows := make([]dlRow, len(taken))
			for i, t := range taken {
				moved = append(moved, t.seq)
				e := t.entry(byseq[t.seq])
				if t.held {
					e.HeldSeq = t.seq
				}
				if refused == nil {
					rows[i] = storableRow(e, w.sql.lim)
				} else {
					rows[i] = minimalRow(e, w.sql.lim, refused)
				}
			}
			return w.insert(ctx, q, rows)
		})
	}
	err := run(nil)
	if err == nil {
		return moved, nil
	}
	if ctx.Err() != nil || !refusedContent(err) {
		return nil, err
	}
	if err2 := run(err); err2 != nil {
		return nil, fmt.Errorf("moving %d row(s) to the dead-letter table: %w (their minimal forms failed too: %v)", len(dead), err, err2)
	}
	return moved, nil
}

// failedRow is an outbox row taken for the dead-letter table, with its failure times, and
// whether it stays in the outbox, held.
type failedRow struct {
	outboxRow
	firstFailedAt, lastFailedAt lenientTime
	held                        bool
}

func (r *failedRow) dest() []any {
	return append(r.outboxRow.dest(), &r.firstFailedAt, &r.lastFailedAt)
}

// entry builds the dead letter of r. A row that could not be read keeps its columns as
// they were in the entry's Raw.
func (r *failedRow) entry(d outboxdriver.DeadLetter) deadletter.Entry {
	m, err := r.message()
	e := deadletter.Entry{
		Message:       m,
		Stage:         deadletter.StageRelay,
		Kind:          deadletter.Kind(d.Kind),
		Reason:        d.Reason,
		Attempts:      r.attempts,
		FirstFailedAt: r.firstFailedAt.t,
		LastFailedAt:  r.lastFailedAt.t,
	}
	if err != nil {
		e.Raw = &deadletter.Raw{ID: r.id, Type: r.typ, Key: r.key, ContentType: r.contentType, CreatedAt: r.createdAt.text}
		if m.Headers == nil {
			e.Raw.HeadersText = r.headers
		}
		if e.Kind == "" {
			e.Kind = deadletter.KindUnreadableRow
		}
	}
	return e
}

// scanFailed reads the rows of a dead-letter write-back's take statement; with held, each
// row ends with a boolean column: whether it stays in the outbox, held.
func scanFailed(rows Rows, held bool) ([]failedRow, error) {
	defer rows.Close()
	var out []failedRow
	for rows.Next() {
		var r failedRow
		dest := r.dest()
		if held {
			dest = append(dest, &r.held)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
