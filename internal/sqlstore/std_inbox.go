package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
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
	// ago is the database clock minus d, for pruning.
	ago func(d time.Duration) (expr string, arg any)
}

var (
	mysqlConsumer = stdConsumer{
		d:        MySQL,
		now:      mysqlNow,
		headers:  "COALESCE(CAST(headers AS CHAR), '')",
		failTime: func(t time.Time) any { return t.UTC() },
		ago: func(d time.Duration) (string, any) {
			return mysqlNow + " - INTERVAL ? MICROSECOND", d.Microseconds()
		},
	}
	sqliteConsumer = stdConsumer{
		d:        SQLite,
		now:      sqliteNow,
		headers:  "COALESCE(headers, '')",
		failTime: func(t time.Time) any { return t.UTC().Format(sqliteClockTime) },
		ago: func(d time.Duration) (string, any) {
			return "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)", fmt.Sprintf("%+.3f seconds", -d.Seconds())
		},
	}
)

// sqliteClockTime is the text form of SQLite's clock (strftime's %f has milliseconds).
const sqliteClockTime = "2006-01-02 15:04:05.000"

// maxConsumerName is the inbox's consumer column size on MySQL.
const maxConsumerName = 255

func (mysqlDialect) InsertInbox(ctx context.Context, q Querier, n *Names, consumer string, id uuid.UUID) (bool, error) {
	if utf8.RuneCountInString(consumer) > maxConsumerName {
		return false, fmt.Errorf("outbox: consumer name %q is over the inbox's limit of %d characters", consumer, maxConsumerName)
	}
	// INSERT IGNORE skips a duplicate; ROW_COUNT() on the same connection says whether the
	// row is new.
	var inserted int64
	err := pinned(ctx, q, func(q Querier) error {
		if err := q.Exec(ctx, "INSERT IGNORE INTO "+n.Inbox+" (consumer, event_id, processed_at) VALUES (?, ?, "+mysqlNow+")", consumer, id.String()); err != nil {
			return err
		}
		return queryRow(ctx, q, []any{&inserted}, "SELECT ROW_COUNT()")
	})
	return inserted == 1, err
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

func (sqliteDialect) InsertInbox(ctx context.Context, q Querier, n *Names, consumer string, id uuid.UUID) (bool, error) {
	return scanOne(ctx, q, nil, "INSERT INTO "+n.Inbox+" (consumer, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING RETURNING 1", consumer, id.String())
}

func (mysqlDialect) SeenInbox(ctx context.Context, q Querier, n *Names, consumer string, id uuid.UUID) (bool, error) {
	return mysqlConsumer.seenInbox(ctx, q, n, consumer, id)
}

func (sqliteDialect) SeenInbox(ctx context.Context, q Querier, n *Names, consumer string, id uuid.UUID) (bool, error) {
	return sqliteConsumer.seenInbox(ctx, q, n, consumer, id)
}

func (stdConsumer) seenInbox(ctx context.Context, q Querier, n *Names, consumer string, id uuid.UUID) (bool, error) {
	return scanOne(ctx, q, nil, "SELECT 1 FROM "+n.Inbox+" WHERE consumer = ? AND event_id = ?", consumer, id.String())
}

func (mysqlDialect) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	ago, arg := mysqlConsumer.ago(olderThan)
	var count int64
	err := pinned(ctx, q, func(q Querier) error {
		if err := q.Exec(ctx, "DELETE FROM "+n.Inbox+" WHERE processed_at < "+ago+" LIMIT ?", arg, limit); err != nil {
			return err
		}
		return queryRow(ctx, q, []any{&count}, "SELECT ROW_COUNT()")
	})
	return count, err
}

func (sqliteDialect) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	ago, arg := sqliteConsumer.ago(olderThan)
	rows, err := q.Query(ctx, "DELETE FROM "+n.Inbox+" WHERE rowid IN (SELECT rowid FROM "+n.Inbox+
		" WHERE processed_at < "+ago+" LIMIT ?) RETURNING 1", arg, limit)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var count int64
	for rows.Next() {
		count++
	}
	return count, rows.Err()
}

// RecordInbox records event id for the consumer named in ctx (consumer.InfoFrom) in n's
// inbox, inside q, the transaction of an idempotent handler of the database/sql-based
// adapters. It returns false for a duplicate delivery. A ctx without a consumer name is a
// permanent error: retrying cannot supply one.
func RecordInbox(ctx context.Context, d Dialect, q Querier, n *Names, id uuid.UUID) (bool, error) {
	c, name, err := consumerOf(ctx, d)
	if err != nil {
		return false, err
	}
	fresh, err := c.InsertInbox(ctx, q, n, name, id)
	if err != nil {
		return false, fmt.Errorf("recording event %s in the inbox: %w", id, err)
	}
	return fresh, nil
}

// SeenInInbox reports whether the consumer named in ctx recorded event id in n's inbox.
func SeenInInbox(ctx context.Context, d Dialect, q Querier, n *Names, id uuid.UUID) (bool, error) {
	c, name, err := consumerOf(ctx, d)
	if err != nil {
		return false, err
	}
	return c.SeenInbox(ctx, q, n, name, id)
}

func consumerOf(ctx context.Context, d Dialect) (ConsumerDialect, string, error) {
	c, err := Consumer(d)
	if err != nil {
		return nil, "", err
	}
	name, err := ConsumerName(ctx)
	if err != nil {
		return nil, "", err
	}
	return c, name, nil
}

// ConsumerName returns the consumer name that consumer.Run puts in handler contexts — the
// inbox's key prefix. A ctx without one is a permanent error: retrying cannot supply one.
func ConsumerName(ctx context.Context) (string, error) {
	info, ok := consumer.InfoFrom(ctx)
	if !ok || info.Consumer == "" {
		return "", outbox.Permanent(errors.New("idempotent handler called without a consumer name in its context (run it through consumer.Consumer, or use consumer.WithInfo)"))
	}
	return info.Consumer, nil
}
