package sqlstore

import (
	"context"
	"slices"

	"github.com/txoutbox/outbox/idempotency"
)

// SQLite's inbox statements of its own; the others are shared (consumer.go).

// InsertInbox is the shared ON CONFLICT DO NOTHING statement (consumer.go).
func (d sqliteDialect) InsertInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return d.insertInbox(ctx, q, n, k)
}

// InsertInboxMany inserts the keys with multi-row INSERT ... ON CONFLICT DO NOTHING
// statements, whose RETURNING names the new ones.
func (sqliteDialect) InsertInboxMany(ctx context.Context, q Querier, n *Names, keys []idempotency.Key) ([]bool, error) {
	uniq, first := uniqueKeys(keys)
	fresh := make([]bool, len(keys))
	for chunk := range slices.Chunk(uniq, maxInboxRows) {
		rows, err := q.Query(ctx, valuesSQL("INSERT INTO "+n.Inbox+" (consumer, event_id) VALUES ", "(?, ?)", len(chunk))+
			" ON CONFLICT DO NOTHING RETURNING consumer, event_id", keyArgs(chunk)...)
		if err != nil {
			return nil, err
		}
		inserted, err := scanKeys(rows)
		if err != nil {
			return nil, err
		}
		for k := range inserted {
			fresh[first[k]] = true
		}
	}
	return fresh, nil
}
