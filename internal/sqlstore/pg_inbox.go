package sqlstore

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/outbox/idempotency"
)

func (postgres) InsertInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanOne(ctx, q, nil, "INSERT INTO "+n.Inbox+" (consumer, event_id) VALUES ($1, $2::uuid) ON CONFLICT DO NOTHING RETURNING 1", k.Consumer, k.EventID.String())
}

// InsertInboxMany inserts the keys with one INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
// NOTHING, whose RETURNING names the new ones. A key that a concurrent transaction inserted
// makes it wait for that transaction, as InsertInbox does. The keys travel as two array
// literals in text, which every driver binds (database/sql ones cannot bind []string), so
// the statement is the same whatever the batch size and its plan is cached.
func (postgres) InsertInboxMany(ctx context.Context, q Querier, n *Names, keys []idempotency.Key) ([]bool, error) {
	uniq, first := uniqueKeys(keys)
	consumers, ids := make([]string, len(uniq)), make([]string, len(uniq))
	for i, k := range uniq {
		consumers[i], ids[i] = k.Consumer, k.EventID.String()
	}
	rows, err := q.Query(ctx, "INSERT INTO "+n.Inbox+` (consumer, event_id)
SELECT c, id FROM unnest($1::text[], $2::uuid[]) AS t(c, id)
ON CONFLICT DO NOTHING RETURNING consumer, event_id::text`, pgArray(consumers), pgArray(ids))
	if err != nil {
		return nil, err
	}
	inserted, err := scanKeys(rows)
	if err != nil {
		return nil, err
	}
	fresh := make([]bool, len(keys))
	for k := range inserted {
		fresh[first[k]] = true
	}
	return fresh, nil
}

// pgArray is the text form of a PostgreSQL array of elems: each element quoted, with its
// backslashes and double quotes escaped.
func pgArray(elems []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range e {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func (postgres) SeenInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanOne(ctx, q, nil, "SELECT 1 FROM "+n.Inbox+" WHERE consumer = $1 AND event_id = $2::uuid", k.Consumer, k.EventID.String())
}

func (postgres) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	return pruneBoth(n, func(table string) (int64, error) {
		return pgDeleteSome(ctx, q, table, "processed_at < now() - $1 * interval '1 millisecond'", []any{olderThan.Milliseconds()}, limit)
	})
}

// pgDeleteSome deletes up to limit rows of table that match where (whose placeholders are
// $1..$len(args)) and returns how many it deleted.
func pgDeleteSome(ctx context.Context, q Querier, table, where string, args []any, limit int) (int64, error) {
	var count int64
	_, err := scanOne(ctx, q, &count, `WITH gone AS (
    DELETE FROM `+table+` WHERE ctid IN (
        SELECT ctid FROM `+table+` WHERE `+where+` LIMIT $`+strconv.Itoa(len(args)+1)+`)
    RETURNING 1)
SELECT count(*) FROM gone`, append(args, limit)...)
	return count, err
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
