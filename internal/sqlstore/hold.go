package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/txoutbox/outbox/outboxdriver"
)

// Held keys (outboxdriver.DeadLetter.HoldKey). A keyed row that the relay dead-letters under
// KeyPolicy HoldKey is not deleted: it stays in the outbox with available_at at its dialect's
// heldAt (later than any time its clock writes) and no lease, and the dead letter records
// its seq (held_seq). Every dialect's claim already refuses a row whose earlier row of the
// same key is leased or waiting for a retry; a held row is a row waiting for a retry that
// never comes due, so no claim takes it or a later row of its key, whatever path the claim
// takes (docs/ordering.md, O7). It is the first row of its key: the relay claims a key's
// rows in seq order and dead-letters a row only when no earlier row of its key is in the
// outbox. Replaying the dead letter makes the row due again where it stands, its key's
// head, so it goes first (same seq; attempts and failure times reset, marked as a replay);
// discarding it deletes the row, and the key moves on (deadletters.go). The consumer's
// held keys are keyhold.go's.

// holdSplit returns the seqs of dead whose rows are to be held, and those to be deleted.
// The store holds a row only if it is keyed: a keyless row asked to be held is deleted.
func holdSplit(dead []outboxdriver.DeadLetter) (hold, drop []int64) {
	for _, d := range dead {
		if d.HoldKey {
			hold = append(hold, d.Seq)
		} else {
			drop = append(drop, d.Seq)
		}
	}
	return hold, drop
}

// splitTaken marks the rows of taken that hold asks to hold and that are keyed, and returns
// their seqs and those of the others, to delete.
func splitTaken(taken []failedRow, hold []int64) (held, gone []int64) {
	for i := range taken {
		r := &taken[i]
		r.held = r.key != "" && slices.Contains(hold, r.seq)
		if r.held {
			held = append(held, r.seq)
		} else {
			gone = append(gone, r.seq)
		}
	}
	return held, gone
}

// HeldKey is a key that a pending dead letter of the relay holds: its later events wait.
type HeldKey struct {
	// Key is the event key held.
	Key string
	// DeadLetterID is the pending dead letter holding it: replay it (its event goes first)
	// or discard it (the key moves on).
	DeadLetterID int64
	// Seq is the outbox row held.
	Seq int64
	// Since is when that event last failed.
	Since time.Time
}

// HeldKeys returns the keys held by pending dead letters of n's relay, the oldest hold
// first, at most limit of them (through the dead-letter table's held index).
func HeldKeys(ctx context.Context, d Dialect, q Querier, n *Names, limit int) ([]HeldKey, error) {
	rows, err := q.Query(ctx, d.sql().rebind("SELECT event_key, id, held_seq, last_failed_at FROM "+n.DeadLetters+
		" WHERE status = 'pending' AND held_seq IS NOT NULL ORDER BY id LIMIT ?"), limit)
	if err != nil {
		return nil, fmt.Errorf("reading the held keys of %s: %w", n.Outbox, Classify(err, n))
	}
	defer rows.Close()
	var out []HeldKey
	for rows.Next() {
		var (
			h     HeldKey
			since lenientTime
		)
		if err := rows.Scan(&h.Key, &h.DeadLetterID, &h.Seq, &since); err == nil {
			err = strictTimes(&since)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the held keys of %s: %w", n.Outbox, err)
		}
		h.Since = since.t
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the held keys of %s: %w", n.Outbox, Classify(err, n))
	}
	return out, nil
}
