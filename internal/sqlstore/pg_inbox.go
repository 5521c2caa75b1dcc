package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/txoutbox/outbox/idempotency"
)

func (postgres) InsertInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanOne(ctx, q, nil, "INSERT INTO "+n.Inbox+" (consumer, event_id) VALUES ($1, $2::uuid) ON CONFLICT DO NOTHING RETURNING 1", k.Consumer, k.EventID.String())
}

// InsertInboxMany inserts the keys with one multi-row INSERT ... ON CONFLICT DO NOTHING per
// chunk; RETURNING names the new ones. A key that a concurrent transaction inserted makes it
// wait for that transaction, as InsertInbox does.
func (postgres) InsertInboxMany(ctx context.Context, q Querier, n *Names, keys []idempotency.Key) ([]bool, error) {
	return insertReturning(ctx, q, n, keys, func(i int) string { return fmt.Sprintf("($%d, $%d::uuid)", 2*i+1, 2*i+2) }, "event_id::text")
}

func (postgres) SeenInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanOne(ctx, q, nil, "SELECT 1 FROM "+n.Inbox+" WHERE consumer = $1 AND event_id = $2::uuid", k.Consumer, k.EventID.String())
}

func (postgres) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	prune := func(table string) (int64, error) {
		var count int64
		_, err := scanOne(ctx, q, &count, `WITH gone AS (
    DELETE FROM `+table+` WHERE ctid IN (
        SELECT ctid FROM `+table+` WHERE processed_at < now() - $1 * interval '1 millisecond' LIMIT $2)
    RETURNING 1)
SELECT count(*) FROM gone`, olderThan.Milliseconds(), limit)
		return count, err
	}
	count, err := prune(n.Inbox)
	if err != nil {
		return 0, err
	}
	if _, err := prune(n.Responses); err != nil {
		return count, err
	}
	return count, nil
}

func (postgres) SaveResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key, r idempotency.Response) error {
	headers, err := responseHeaders(r)
	if err != nil {
		return err
	}
	return q.Exec(ctx, "INSERT INTO "+n.Responses+` (consumer, event_id, request_hash, status, headers, body)
VALUES ($1, $2::uuid, $3, $4, $5, $6)`, k.Consumer, k.EventID.String(), r.RequestHash, r.Status, headers, nonNil(r.Body))
}

func (postgres) LoadResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key) (idempotency.Response, bool, error) {
	return loadResponse(ctx, q, "SELECT request_hash, status, headers, body FROM "+n.Responses+" WHERE consumer = $1 AND event_id = $2::uuid", k)
}
