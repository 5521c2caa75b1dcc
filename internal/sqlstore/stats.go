package sqlstore

import (
	"context"
	"fmt"

	"github.com/txoutbox/outbox/outboxdriver"
)

// statsSQL reads an outbox's backlog and pending dead letters in one statement, the same on
// every dialect: the oldest undelivered row by the primary key (seq order is insert order),
// the pending dead letters and their oldest by the (status, last_failed_at) index, the keys
// they hold by the held index (migration 006), the scheduled events and the next due by the
// due index (008). The counts cost O(rows counted); the gauges
// sample it once per collection, not per event.
func statsSQL(n *Names) string {
	return "SELECT (SELECT count(*) FROM " + n.Outbox + "), " +
		"(SELECT created_at FROM " + n.Outbox + " ORDER BY seq LIMIT 1), " +
		"(SELECT count(*) FROM " + n.DeadLetters + " WHERE status = 'pending'), " +
		"(SELECT min(last_failed_at) FROM " + n.DeadLetters + " WHERE status = 'pending'), " +
		"(SELECT count(DISTINCT event_key) FROM " + n.DeadLetters + " WHERE status = 'pending' AND held_seq IS NOT NULL), " +
		"(SELECT count(*) FROM " + n.Scheduled + "), " +
		"(SELECT min(deliver_at) FROM " + n.Scheduled + ")"
}

// readStats is every dialect store's outboxdriver.StatsReader.
func readStats(ctx context.Context, q Querier, n *Names) (outboxdriver.Stats, error) {
	st := outboxdriver.Stats{Outbox: n.Prefix}
	if n.Schema != "" {
		st.Outbox = n.Schema + "." + n.Prefix
	}
	rows, err := q.Query(ctx, statsSQL(n))
	if err != nil {
		return st, fmt.Errorf("reading the stats of %s: %w", st.Outbox, err)
	}
	defer rows.Close()
	var oldest, oldestDead, nextDue lenientTime
	if rows.Next() {
		if err = rows.Scan(&st.Backlog, &oldest, &st.DeadLettersPending, &oldestDead, &st.HeldKeys, &st.Scheduled, &nextDue); err == nil {
			err = strictTimes(&oldest, &oldestDead, &nextDue)
		}
	}
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return st, fmt.Errorf("reading the stats of %s: %w", st.Outbox, err)
	}
	st.OldestUndelivered, st.OldestPendingDeadLetter, st.NextDue = oldest.t, oldestDead.t, nextDue.t
	return st, nil
}
