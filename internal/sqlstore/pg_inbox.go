package sqlstore

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

func (postgres) InsertInbox(ctx context.Context, q Querier, n *Names, consumer string, id uuid.UUID) (bool, error) {
	return scanOne(ctx, q, nil, "INSERT INTO "+n.Inbox+" (consumer, event_id) VALUES ($1, $2::uuid) ON CONFLICT DO NOTHING RETURNING 1", consumer, id.String())
}

// InboxKey is the key of one inbox row: a consumer and an event it handled.
type InboxKey struct {
	Consumer string
	EventID  uuid.UUID
}

// PostgresRecordInboxMany records keys in n's PostgreSQL inbox in one statement, inside the
// transaction q, and reports which were new: fresh[i] is false when keys[i] was recorded
// before, or appears earlier in keys. The rows are inserted in one fixed order (the keys
// sorted), so two such statements never wait for each other's rows in a cycle. It binds text
// arrays, so q must be a pgx connection or transaction (database/sql drivers generally
// cannot bind []string).
func PostgresRecordInboxMany(ctx context.Context, q Querier, n *Names, keys []InboxKey) (fresh []bool, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("recording %d events in the inbox: %w", len(keys), err)
		}
	}()
	fresh = make([]bool, len(keys))
	first := make(map[InboxKey]int, len(keys)) // a key → its first index in keys
	for i, k := range keys {
		if _, dup := first[k]; !dup {
			first[k] = i
		}
	}
	uniq := slices.SortedFunc(maps.Keys(first), func(a, b InboxKey) int {
		if c := strings.Compare(a.Consumer, b.Consumer); c != 0 {
			return c
		}
		return bytes.Compare(a.EventID[:], b.EventID[:])
	})
	consumers, ids := make([]string, len(uniq)), make([]string, len(uniq))
	for i, k := range uniq {
		consumers[i], ids[i] = k.Consumer, k.EventID.String()
	}
	rows, err := q.Query(ctx, "INSERT INTO "+n.Inbox+` (consumer, event_id)
SELECT c, id::uuid FROM unnest($1::text[], $2::text[]) AS t(c, id)
ON CONFLICT DO NOTHING RETURNING consumer, event_id::text`, consumers, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k InboxKey
		var id string
		if err := rows.Scan(&k.Consumer, &id); err != nil {
			return nil, err
		}
		if k.EventID, err = uuid.Parse(id); err != nil {
			return nil, err
		}
		if i, ok := first[k]; ok {
			fresh[i] = true
		}
	}
	return fresh, rows.Err()
}

func (postgres) SeenInbox(ctx context.Context, q Querier, n *Names, consumer string, id uuid.UUID) (bool, error) {
	return scanOne(ctx, q, nil, "SELECT 1 FROM "+n.Inbox+" WHERE consumer = $1 AND event_id = $2::uuid", consumer, id.String())
}

func (postgres) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	var count int64
	_, err := scanOne(ctx, q, &count, `WITH gone AS (
    DELETE FROM `+n.Inbox+` WHERE ctid IN (
        SELECT ctid FROM `+n.Inbox+` WHERE processed_at < now() - $1 * interval '1 millisecond' LIMIT $2)
    RETURNING 1)
SELECT count(*) FROM gone`, olderThan.Milliseconds(), limit)
	return count, err
}
