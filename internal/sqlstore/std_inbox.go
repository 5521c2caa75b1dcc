package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/idempotency"
)

// stdConsumer is the inbox and dead-letter SQL of the dialects written with '?' placeholders
// (MySQL, SQLite): the same statements as PostgreSQL's, with each dialect's clock, header
// text and time binding.
type stdConsumer struct {
	d Dialect
	// now is the database clock; headers turns the headers column into text ('' for none).
	now, headers string
	// failTime binds a failure or filter time the way the dialect stores the clock's.
	failTime func(time.Time) any
	// contains is the condition "reason contains ?" (case-sensitive).
	contains string
	// ago is the database clock minus d, for pruning.
	ago func(d time.Duration) (expr string, arg any)
	// lockRow ends a read that locks the rows it reads until the transaction ends (MySQL);
	// SQLite's replay holds the database's write lock already.
	lockRow string
	// replayHeaders is the headers column with outbox.ReplayHeader set to the argument.
	replayHeaders string
}

var (
	mysqlConsumer = stdConsumer{
		d:        MySQL,
		now:      mysqlNow,
		headers:  "COALESCE(CAST(headers AS CHAR), '')",
		failTime: func(t time.Time) any { return t.UTC() },
		contains: "LOCATE(?, reason) > 0", // the table's utf8mb4_bin collation compares bytes
		ago: func(d time.Duration) (string, any) {
			return mysqlNow + " - INTERVAL ? MICROSECOND", d.Microseconds()
		},
		lockRow:       " FOR UPDATE",
		replayHeaders: `JSON_SET(COALESCE(headers, JSON_OBJECT()), '$."` + outbox.ReplayHeader + `"', ?)`,
	}
	sqliteConsumer = stdConsumer{
		d:        SQLite,
		now:      sqliteNow,
		headers:  "COALESCE(headers, '')",
		failTime: func(t time.Time) any { return t.UTC().Format(sqliteClockTime) },
		contains: "instr(reason, ?) > 0",
		ago: func(d time.Duration) (string, any) {
			return "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)", fmt.Sprintf("%+.3f seconds", -d.Seconds())
		},
		replayHeaders: `json_set(COALESCE(headers, '{}'), '$."` + outbox.ReplayHeader + `"', ?)`,
	}
)

// sqliteClockTime is the text form of SQLite's clock (strftime's %f has milliseconds).
const sqliteClockTime = "2006-01-02 15:04:05.000"

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
		return queryRow(ctx, q, []any{&inserted}, "SELECT ROW_COUNT()")
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

// pinned runs fn on one connection: q itself when it is a transaction, a transaction of
// its own when q is a pool (a DB), so that session functions such as ROW_COUNT() see the
// statement before them.
func pinned(ctx context.Context, q Querier, fn func(Querier) error) error {
	if db, ok := q.(DB); ok {
		return db.InTx(ctx, fn)
	}
	return fn(q)
}

func (sqliteDialect) InsertInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanOne(ctx, q, nil, "INSERT INTO "+n.Inbox+" (consumer, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING RETURNING 1", k.Consumer, k.EventID.String())
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

func (mysqlDialect) SeenInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return seenInbox(ctx, q, n, k)
}

func (sqliteDialect) SeenInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return seenInbox(ctx, q, n, k)
}

func seenInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanOne(ctx, q, nil, "SELECT 1 FROM "+n.Inbox+" WHERE consumer = ? AND event_id = ?", k.Consumer, k.EventID.String())
}

func (mysqlDialect) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	return mysqlConsumer.pruneInbox(ctx, q, n, olderThan, limit)
}

func (sqliteDialect) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	return sqliteConsumer.pruneInbox(ctx, q, n, olderThan, limit)
}

func (c stdConsumer) pruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	ago, arg := c.ago(olderThan)
	return pruneBoth(n, func(table string) (int64, error) {
		return c.deleteSome(ctx, q, table, "processed_at < "+ago, []any{arg}, limit)
	})
}

// deleteSome deletes up to limit rows of table that match where (with args) and returns
// how many it deleted.
func (c stdConsumer) deleteSome(ctx context.Context, q Querier, table, where string, args []any, limit int) (count int64, err error) {
	args = append(args, limit)
	if c.d == MySQL {
		err = pinned(ctx, q, func(q Querier) error {
			if err := q.Exec(ctx, "DELETE FROM "+table+" WHERE "+where+" LIMIT ?", args...); err != nil {
				return err
			}
			return queryRow(ctx, q, []any{&count}, "SELECT ROW_COUNT()")
		})
		return count, err
	}
	rows, err := q.Query(ctx, "DELETE FROM "+table+" WHERE rowid IN (SELECT rowid FROM "+table+
		" WHERE "+where+" LIMIT ?) RETURNING 1", args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	for rows.Next() {
		count++
	}
	return count, rows.Err()
}

// pruneBoth prunes the inbox, then the stored responses, and returns the inbox's count.
func pruneBoth(n *Names, prune func(table string) (int64, error)) (int64, error) {
	count, err := prune(n.Inbox)
	if err != nil {
		return 0, err
	}
	if _, err := prune(n.Responses); err != nil {
		return count, err
	}
	return count, nil
}

func (mysqlDialect) SaveResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key, r idempotency.Response) error {
	return saveResponse(ctx, q, n, k, r, "(?, ?, ?, ?, ?, ?, "+mysqlNow+")")
}

func (sqliteDialect) SaveResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key, r idempotency.Response) error {
	return saveResponse(ctx, q, n, k, r, "(?, ?, ?, ?, ?, ?, "+sqliteNow+")")
}

func saveResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key, r idempotency.Response, values string) error {
	headers, err := responseHeaders(r)
	if err != nil {
		return err
	}
	return q.Exec(ctx, "INSERT INTO "+n.Responses+" (consumer, event_id, request_hash, status, headers, body, processed_at) VALUES "+values,
		k.Consumer, k.EventID.String(), r.RequestHash, r.Status, headers, nonNil(r.Body))
}

func (mysqlDialect) LoadResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key) (idempotency.Response, bool, error) {
	return loadResponse(ctx, q, "SELECT request_hash, status, headers, body FROM "+n.Responses+" WHERE consumer = ? AND event_id = ?", k)
}

func (sqliteDialect) LoadResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key) (idempotency.Response, bool, error) {
	return loadResponse(ctx, q, "SELECT request_hash, status, headers, body FROM "+n.Responses+" WHERE consumer = ? AND event_id = ?", k)
}
