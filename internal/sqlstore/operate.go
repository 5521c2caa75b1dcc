package sqlstore

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// This file holds what an operator asks of an outbox beyond the relay's and the consumers'
// own statements: who holds leases, what waits for a retry, what the dead letters are made
// of. The outbox's backlog and lag are readStats, shared with the relay's gauges; its
// schema's state is schema.go's; held keys are hold.go's.

// Lease is what one relay holds of an outbox.
type Lease struct {
	Owner string
	// Rows counts the rows it holds; Until is when its last lease expires.
	Rows  int64
	Until time.Time
}

// Leases returns the live leases on n's outbox by owner, and the database's clock.
func Leases(ctx context.Context, d Dialect, q Querier, n *Names) ([]Lease, time.Time, error) {
	now := d.sql().now
	rows, err := q.Query(ctx, "SELECT lease_owner, count(*), max(lease_until), "+now+" FROM "+n.Outbox+
		" WHERE lease_until > "+now+" GROUP BY lease_owner ORDER BY lease_owner")
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("reading the leases of %s: %w", n.Outbox, err)
	}
	defer rows.Close()
	var out []Lease
	var clock lenientTime
	for rows.Next() {
		var l Lease
		var owner *string
		var until lenientTime
		err := rows.Scan(&owner, &l.Rows, &until, &clock)
		if err == nil {
			err = strictTimes(&until, &clock)
		}
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("reading the leases of %s: %w", n.Outbox, err)
		}
		if owner != nil {
			l.Owner = *owner
		}
		l.Until = until.t
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("reading the leases of %s: %w", n.Outbox, err)
	}
	if len(out) == 0 {
		_, err := scanRow(ctx, q, []any{&clock}, "SELECT "+now)
		if err == nil {
			err = strictTimes(&clock)
		}
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("reading the database clock: %w", err)
		}
	}
	return out, clock.t, nil
}

// Retrying counts the outbox rows that failed to be sent and wait for another attempt (not
// the rows held by a dead letter: see HeldKeys).
func Retrying(ctx context.Context, d Dialect, q Querier, n *Names) (int64, error) {
	s := d.sql()
	var count int64
	_, err := scanRow(ctx, q, []any{&count}, "SELECT count(*) FROM "+n.Outbox+
		" WHERE last_error IS NOT NULL AND (lease_until IS NULL OR lease_until <= "+s.now+") AND available_at <> "+s.heldAt)
	if err != nil {
		return 0, fmt.Errorf("counting the retrying rows of %s: %w", n.Outbox, err)
	}
	return count, nil
}

// DeadLetterGroup counts the dead letters that share a status, stage, kind, event type and
// consumer.
type DeadLetterGroup struct {
	Status, Stage, Kind, EventType, Consumer string
	Count                                    int64
	// FirstFailedAt and LastFailedAt span the group's last failures.
	FirstFailedAt, LastFailedAt time.Time
}

// DeadLetterGroups counts n's dead letters by status, stage, kind, event type and consumer,
// in that order.
func DeadLetterGroups(ctx context.Context, d Dialect, q Querier, n *Names) ([]DeadLetterGroup, error) {
	rows, err := q.Query(ctx, "SELECT status, stage, kind, event_type, consumer, count(*), min(last_failed_at), max(last_failed_at) FROM "+
		n.DeadLetters+" GROUP BY status, stage, kind, event_type, consumer ORDER BY status, stage, kind, event_type, consumer")
	if err != nil {
		return nil, fmt.Errorf("counting the dead letters of %s: %w", n.Outbox, err)
	}
	defer rows.Close()
	var out []DeadLetterGroup
	for rows.Next() {
		var g DeadLetterGroup
		var first, last lenientTime
		err := rows.Scan(&g.Status, &g.Stage, &g.Kind, &g.EventType, &g.Consumer, &g.Count, &first, &last)
		if err == nil {
			err = strictTimes(&first, &last)
		}
		if err != nil {
			return nil, fmt.Errorf("counting the dead letters of %s: %w", n.Outbox, err)
		}
		g.FirstFailedAt, g.LastFailedAt = first.t, last.t
		out = append(out, g)
	}
	return out, rows.Err()
}

// DeadLetterBucket counts the dead letters of one kind that last failed in one interval.
type DeadLetterBucket struct {
	Kind  string
	Start time.Time
	Count int64
}

// DeadLetterHistory counts n's dead letters (whatever their status) by kind and by the
// interval of width step, aligned on the Unix epoch, in which they last failed, from since
// on. Intervals without any are left out.
func DeadLetterHistory(ctx context.Context, d Dialect, q Querier, n *Names, since time.Time, step time.Duration) ([]DeadLetterBucket, error) {
	secs := int64(step / time.Second)
	if secs < 1 {
		return nil, fmt.Errorf("outbox: dead-letter history step %v is under a second", step)
	}
	s := d.sql()
	w := strconv.FormatInt(secs, 10)
	rows, err := q.Query(ctx, s.rebind("SELECT kind, "+s.bucket("last_failed_at", w)+", count(*) FROM "+
		n.DeadLetters+" WHERE last_failed_at >= ? GROUP BY 1, 2 ORDER BY 2, 1"), s.bindTime(since))
	if err != nil {
		return nil, fmt.Errorf("reading the dead-letter history of %s: %w", n.Outbox, err)
	}
	defer rows.Close()
	var out []DeadLetterBucket
	for rows.Next() {
		var b DeadLetterBucket
		var start int64
		if err := rows.Scan(&b.Kind, &start, &b.Count); err != nil {
			return nil, fmt.Errorf("reading the dead-letter history of %s: %w", n.Outbox, err)
		}
		b.Start = time.Unix(start, 0).UTC()
		out = append(out, b)
	}
	return out, rows.Err()
}
