package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// This file is the consumer's side of held keys (consumer.Config.HoldKeys): whether a key
// has a dead letter of the consumer that holds its later events. The relay's side is
// hold.go.

// heldByQuery is deadletter.KeyHolds' rule in one statement over the dead-letter table t,
// with ? placeholders, in this order: consumer, key (pending); consumer, key, replayed
// after, published after (the replay window); consumer, key (pending, for a replayed
// event); consumer, key (its earlier replays); consumer, key, event (the event's place).
// The event's place is the first of its replayed entries; every sub-select reads one of
// the indexes of migration 6 or the event_id index.
func heldByQuery(t, eventParam string) string {
	ck := "consumer = ? AND event_key = ? AND stage = 'consumer'"
	return `SELECT COALESCE(CASE WHEN m.place IS NULL THEN COALESCE(
    (SELECT MIN(id) FROM ` + t + ` WHERE ` + ck + ` AND status = 'pending'),
    (SELECT MIN(id) FROM ` + t + ` WHERE ` + ck + ` AND status = 'replayed' AND status_changed_at > ? AND created_at < ?))
  ELSE (SELECT MIN(p.id) FROM ` + t + ` p WHERE p.` + strings.ReplaceAll(ck, " AND ", " AND p.") + ` AND p.status = 'pending'
        AND (p.id < m.place OR EXISTS (SELECT 1 FROM ` + t + ` r WHERE r.` + strings.ReplaceAll(ck, " AND ", " AND r.") + `
             AND r.status = 'replayed' AND r.event_id = p.event_id AND r.id < m.place)))
  END, 0)
FROM (SELECT (SELECT MIN(id) FROM ` + t + ` WHERE ` + ck + ` AND status = 'replayed' AND event_id = ` + eventParam + `) AS place) m`
}

// heldByArgs are heldByQuery's arguments; replayedAfter and publishedAfter bind the same
// time the way the table's status_changed_at and created_at hold it.
func heldByArgs(consumer, key string, event any, replayedAfter, publishedAfter any) []any {
	return []any{consumer, key, consumer, key, replayedAfter, publishedAfter,
		consumer, key, consumer, key, consumer, key, event}
}

// HeldBy implements deadletter.KeyHolds.
func (t *deadLetters) HeldBy(ctx context.Context, consumer, key string, event uuid.UUID, published time.Time) (int64, error) {
	var id int64
	query := t.sql.rebind(heldByQuery(t.n.DeadLetters, t.sql.uuidParam))
	args := heldByArgs(consumer, key, event.String(), t.sql.bindTime(published), t.sql.bindCreated(published))
	if _, err := scanRow(ctx, t.db, []any{&id}, query, args...); err != nil {
		return 0, fmt.Errorf("deadletter: looking up whether key %q is held in %s: %w", key, t.n.DeadLetters, err)
	}
	return id, nil
}
