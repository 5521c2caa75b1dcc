package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/txoutbox/outbox/idempotency"
)

// MySQL's inbox statements of its own; the others are shared (consumer.go).

// maxConsumerName is the inbox's consumer column size on MySQL.
const maxConsumerName = 255

func checkConsumer(k idempotency.Key) error {
	if utf8.RuneCountInString(k.Consumer) > maxConsumerName {
		return fmt.Errorf("outbox: consumer name %q is over the inbox's limit of %d characters", k.Consumer, maxConsumerName)
	}
	return nil
}

func (mysqlDialect) InsertInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	if err := checkConsumer(k); err != nil {
		return false, err
	}
	// INSERT IGNORE skips a duplicate; ROW_COUNT() on the same connection says whether the
	// row is new.
	var inserted int64
	err := pinned(ctx, q, func(q Querier) error {
		if err := q.Exec(ctx, "INSERT IGNORE INTO "+n.Inbox+" (consumer, event_id, processed_at) VALUES (?, ?, "+mysqlNow+")", k.Consumer, k.EventID.String()); err != nil {
			return err
		}
		_, err := scanRow(ctx, q, []any{&inserted}, "SELECT ROW_COUNT()")
		return err
	})
	return inserted == 1, err
}

// InsertInboxMany has no RETURNING to learn which rows are new (MySQL has none), so it
// reads which keys exist, then inserts the others with a plain INSERT. A key that a
// concurrent transaction inserted in between fails the INSERT with a duplicate-key error
// rather than being skipped, which the caller handles by recording keys one by one.
func (mysqlDialect) InsertInboxMany(ctx context.Context, q Querier, n *Names, keys []idempotency.Key) ([]bool, error) {
	for _, k := range keys {
		if err := checkConsumer(k); err != nil {
			return nil, err
		}
	}
	uniq, first := uniqueKeys(keys)
	fresh := make([]bool, len(keys))
	for chunk := range slices.Chunk(uniq, maxInboxRows) {
		args := keyArgs(chunk)
		rows, err := q.Query(ctx, "SELECT consumer, event_id FROM "+n.Inbox+" WHERE (consumer, event_id) IN ("+
			repeatSQL("", "(?, ?)", ", ", len(chunk))+")", args...)
		if err != nil {
			return nil, err
		}
		existing, err := scanKeys(rows)
		if err != nil {
			return nil, err
		}
		var insert []any
		for _, k := range chunk {
			if !existing[k] {
				insert = append(insert, k.Consumer, k.EventID.String())
				fresh[first[k]] = true
			}
		}
		if len(insert) == 0 {
			continue
		}
		if err := q.Exec(ctx, valuesSQL("INSERT INTO "+n.Inbox+" (consumer, event_id, processed_at) VALUES ",
			"(?, ?, "+mysqlNow+")", len(insert)/2), insert...); err != nil {
			return nil, err
		}
	}
	return fresh, nil
}
