package sqlstore

import (
	"context"
	"strings"

	"github.com/txoutbox/outbox/idempotency"
)

// PostgreSQL's inbox statements of its own; the others are shared (consumer.go).

// InsertInbox is the shared ON CONFLICT DO NOTHING statement (consumer.go).
func (d postgres) InsertInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return d.insertInbox(ctx, q, n, k)
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
