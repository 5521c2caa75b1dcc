package sqlstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/txoutbox/outbox"
)

// This file holds scheduled events (outbox.WithDeliverAt, migration 008): Publish writes an
// event due later to the scheduled table instead of the outbox, the relay's store moves the
// due ones into the outbox before it claims (dueMover), and Cancel deletes one still
// waiting. The claim never reads the scheduled table, so events due tomorrow cost today's
// claims nothing; a moved event enters the outbox behind what is there, which is what
// "a scheduled keyed event takes its place in its key's order when it becomes due" means
// (docs/scheduled.md).

const (
	// moveLimit bounds the rows one move takes: a claim's worth, so a move is one short
	// transaction even when a million rows fall due at once (the next claim moves more).
	moveLimit = 1000
	// dueRecheck is how often a store looks for rows that became due when it knows of none
	// due sooner: a row scheduled by another process for earlier than the store thought is
	// moved at most this late. One index probe each time.
	dueRecheck = 250 * time.Millisecond
	// dueMinRecheck is the least time between two looks.
	dueMinRecheck = 5 * time.Millisecond
	// scheduledInsertRows keeps one INSERT of scheduled rows under every dialect's
	// parameter limit (8 a row; SQLite's old builds allow 999).
	scheduledInsertRows  = 120
	scheduledInsertBytes = 4 << 20
)

// splitScheduled returns msgs split into those to deliver at once and those due after now.
// It returns msgs itself, not a copy, when none is scheduled (the common case).
func splitScheduled(msgs []outbox.Message, now time.Time) (immediate, later []outbox.Message) {
	first := -1
	for i, m := range msgs {
		if m.DeliverAt.After(now) {
			first = i
			break
		}
	}
	if first < 0 {
		return msgs, nil
	}
	immediate = append(immediate, msgs[:first]...)
	for _, m := range msgs[first:] {
		if m.DeliverAt.After(now) {
			later = append(later, m)
		} else {
			immediate = append(immediate, m)
		}
	}
	return immediate, later
}

// PublishScheduled writes the messages of msgs due later than now to n's scheduled table
// through q, the caller's transaction, and returns the others, for the caller to insert
// into the outbox as it does (a multi-row INSERT, or COPY).
func PublishScheduled(ctx context.Context, d Dialect, q Querier, n *Names, msgs []outbox.Message) ([]outbox.Message, error) {
	immediate, later := splitScheduled(msgs, time.Now())
	if len(later) == 0 {
		return immediate, nil
	}
	return immediate, insertScheduled(ctx, d, q, n, later)
}

// insertScheduled writes msgs to n's scheduled table through q, the caller's transaction.
func insertScheduled(ctx context.Context, d Dialect, q Querier, n *Names, msgs []outbox.Message) error {
	s := d.sql()
	if d.Name() == MySQL.Name() { // non-strict MySQL would truncate, as in its Insert
		if err := mysqlCheckLens(msgs); err != nil {
			return err
		}
	}
	head := "INSERT INTO " + n.Scheduled + " (id, type, " + s.key + ", headers, content_type, body, created_at, deliver_at) VALUES "
	tuple := "(" + s.uuidParam + ",?,?," + s.jsonParam + ",?,?,?,?)"
	return insertChunks(msgs, scheduledInsertRows, scheduledInsertBytes, func(chunk []outbox.Message) error {
		args := make([]any, 0, 8*len(chunk))
		for _, m := range chunk {
			a := messageArgs(m)
			a[6] = s.bindCreated(m.CreatedAt)
			// Rounded up to the millisecond (SQLite's clock's precision): never early.
			due := m.DeliverAt.Add(time.Millisecond - 1).Truncate(time.Millisecond)
			args = append(args, append(a, s.bindTime(due))...)
		}
		return q.Exec(ctx, s.rebind(valuesSQL(head, tuple, len(chunk))), args...)
	})
}

// Cancel deletes the scheduled event id through q, the caller's transaction, and reports
// whether it was still scheduled: false once the relay moved it into the outbox (it is due,
// and is being or was delivered), after an earlier Cancel, or for an ID never scheduled. A
// move in progress makes Cancel wait for it and report false.
func Cancel(ctx context.Context, d Dialect, q Querier, n *Names, id uuid.UUID) (bool, error) {
	ok, err := cancelScheduled(ctx, d, q, n, id)
	if err != nil {
		return false, fmt.Errorf("cancelling scheduled event %s of %s: %w", id, n.Outbox, Classify(err, n))
	}
	return ok, nil
}

func cancelScheduled(ctx context.Context, d Dialect, q Querier, n *Names, id uuid.UUID) (bool, error) {
	s := d.sql()
	var seq int64
	found, err := scanRow(ctx, q, []any{&seq},
		s.rebind("SELECT seq FROM "+n.Scheduled+" WHERE id = "+s.uuidParam+" ORDER BY seq LIMIT 1"+s.lockRows), id.String())
	if err != nil || !found {
		return false, err
	}
	return true, q.Exec(ctx, s.rebind("DELETE FROM "+n.Scheduled+" WHERE seq = ?"), seq)
}

// moveDue moves up to limit due rows of n's scheduled table into its outbox, in due order,
// in one transaction, and returns how many it moved. Rows another mover holds are skipped
// (SKIP LOCKED where the dialect has it; SQLite's writer holds the whole database).
func moveDue(ctx context.Context, d Dialect, db DB, n *Names, limit int) (moved int, err error) {
	s := d.sql()
	err = db.InTx(ctx, func(q Querier) error {
		rows, err := q.Query(ctx, s.rebind("SELECT seq FROM "+n.Scheduled+" WHERE deliver_at <= "+s.now+
			" ORDER BY deliver_at, seq LIMIT ?"+s.skipLocked), limit)
		if err != nil {
			return err
		}
		var seqs []int64
		for rows.Next() {
			var seq int64
			if err := rows.Scan(&seq); err != nil {
				rows.Close()
				return err
			}
			seqs = append(seqs, seq)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(seqs) == 0 {
			return err
		}
		cols := "id, type, " + s.key + ", headers, content_type, body, created_at"
		if err := q.Exec(ctx, "INSERT INTO "+n.Outbox+" ("+cols+") SELECT "+cols+" FROM "+n.Scheduled+
			" WHERE "+inSeqs(seqs)+" ORDER BY deliver_at, seq"); err != nil {
			return err
		}
		moved = len(seqs)
		return q.Exec(ctx, "DELETE FROM "+n.Scheduled+" WHERE "+inSeqs(seqs))
	})
	if err != nil {
		return 0, fmt.Errorf("moving due scheduled events into %s: %w", n.Outbox, err)
	}
	return moved, nil
}

// nextDue returns when the first row of n's scheduled table is due; zero when there is none.
func nextDue(ctx context.Context, q Querier, n *Names) (time.Time, error) {
	var due lenientTime
	if _, err := scanRow(ctx, q, []any{&due}, "SELECT min(deliver_at) FROM "+n.Scheduled); err != nil {
		return time.Time{}, err
	}
	if err := strictTimes(&due); err != nil {
		return time.Time{}, err
	}
	return due.t, nil
}

// dueMover is a relay store's memory of the scheduled table: when it next needs a look.
// Claims call move before claiming; it costs nothing until the next row is due or the
// recheck interval has passed, and one claim at a time does the work (the others claim
// what is already in the outbox).
type dueMover struct {
	mu      sync.Mutex
	checkAt time.Time // zero: look at the next claim
}

// move moves the due rows of n's scheduled table into the outbox when it is time to look.
// A look is one index probe (nextDue) while nothing is due, the common case: an idle
// outbox costs one statement per dueRecheck, not a transaction.
func (m *dueMover) move(ctx context.Context, d Dialect, db DB, n *Names) error {
	if !m.mu.TryLock() {
		return nil
	}
	defer m.mu.Unlock()
	now := time.Now()
	if !m.checkAt.IsZero() && now.Before(m.checkAt) {
		return nil
	}
	next, err := nextDue(ctx, db, n)
	if err == nil && !next.IsZero() && !next.After(now) {
		var moved int
		if moved, err = moveDue(ctx, d, db, n, moveLimit); err != nil {
			return err
		}
		if moved == moveLimit {
			m.checkAt = time.Time{} // more are due: move them at the next claim
			return nil
		}
		next, err = nextDue(ctx, db, n) // what is left, for the next look
	}
	if err != nil {
		return fmt.Errorf("reading the next due scheduled event of %s: %w", n.Outbox, err)
	}
	m.checkAt = now.Add(dueRecheck)
	if !next.IsZero() && next.Before(m.checkAt) {
		// Not before dueMinRecheck: a database clock behind ours would otherwise make
		// every claim look again until it catches up.
		m.checkAt = next
		if floor := now.Add(dueMinRecheck); m.checkAt.Before(floor) {
			m.checkAt = floor
		}
	}
	return nil
}
