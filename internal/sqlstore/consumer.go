package sqlstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
)

// This file is the consumer side of a dialect: the inbox's statements (those that differ by
// dialect are in postgres_inbox.go, mysql_inbox.go and sqlite_inbox.go) and the dead-letter
// table. inbox.go builds idempotency.Inbox on them.

// ConsumerDialect is the consumer side of a dialect: the inbox (idempotency keys, and the
// HTTP responses stored with them) and the dead-letter table.
type ConsumerDialect interface {
	// InsertInbox records key inside the caller's transaction q. It returns false when key
	// was recorded before: a duplicate.
	InsertInbox(ctx context.Context, q Querier, n *Names, key idempotency.Key) (bool, error)
	// InsertInboxMany records keys inside q; fresh[i] is false when keys[i] was recorded
	// before or appears earlier in keys.
	InsertInboxMany(ctx context.Context, q Querier, n *Names, keys []idempotency.Key) (fresh []bool, err error)
	// SeenInbox reports whether key is recorded.
	SeenInbox(ctx context.Context, q Querier, n *Names, key idempotency.Key) (bool, error)
	// PruneInbox deletes up to limit inbox rows older than olderThan, and up to limit stored
	// responses as old, and returns how many inbox rows it deleted.
	PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error)
	// SaveResponse stores an HTTP response under key inside q.
	SaveResponse(ctx context.Context, q Querier, n *Names, key idempotency.Key, r idempotency.Response) error
	// LoadResponse reads the response stored under key.
	LoadResponse(ctx context.Context, q Querier, n *Names, key idempotency.Key) (idempotency.Response, bool, error)
	// DeadLetters returns the dead-letter table over db.
	DeadLetters(db DB, n *Names) deadletter.Table
}

// Consumer returns d's consumer side, or an error naming the dialect if it has none.
func Consumer(d Dialect) (ConsumerDialect, error) {
	c, ok := d.(ConsumerDialect)
	if !ok {
		return nil, fmt.Errorf("outbox: the %s dialect has no inbox or dead-letter support yet", d.Name())
	}
	return c, nil
}

// insertInbox is InsertInbox for the dialects with INSERT ... ON CONFLICT DO NOTHING
// RETURNING (PostgreSQL, SQLite): the row comes back only when it is new.
func (s *dialectSQL) insertInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanRow(ctx, q, nil, s.rebind("INSERT INTO "+n.Inbox+" (consumer, event_id) VALUES (?, "+s.uuidParam+
		") ON CONFLICT DO NOTHING RETURNING 1"), k.Consumer, k.EventID.String())
}

// SeenInbox implements ConsumerDialect for every dialect.
func (s *dialectSQL) SeenInbox(ctx context.Context, q Querier, n *Names, k idempotency.Key) (bool, error) {
	return scanRow(ctx, q, nil, s.rebind("SELECT 1 FROM "+n.Inbox+" WHERE consumer = ? AND event_id = "+s.uuidParam),
		k.Consumer, k.EventID.String())
}

// PruneInbox implements ConsumerDialect for every dialect: the inbox, then the stored
// responses.
func (s *dialectSQL) PruneInbox(ctx context.Context, q Querier, n *Names, olderThan time.Duration, limit int) (int64, error) {
	ago, arg := s.ago(olderThan)
	count, err := s.deleteSome(ctx, q, n.Inbox, "processed_at < "+ago, []any{arg}, limit)
	if err != nil {
		return 0, err
	}
	if _, err := s.deleteSome(ctx, q, n.Responses, "processed_at < "+ago, []any{arg}, limit); err != nil {
		return count, err
	}
	return count, nil
}

// SaveResponse implements ConsumerDialect for every dialect.
func (s *dialectSQL) SaveResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key, r idempotency.Response) error {
	headers, err := json.Marshal(r.Header)
	if err != nil {
		return fmt.Errorf("encoding the response's header: %w", err)
	}
	body := r.Body
	if body == nil {
		body = []byte{} // NOT NULL
	}
	return q.Exec(ctx, s.rebind("INSERT INTO "+n.Responses+" (consumer, event_id, request_hash, status, headers, body, processed_at) VALUES (?, "+
		s.uuidParam+", ?, ?, ?, ?, "+s.now+")"), k.Consumer, k.EventID.String(), r.RequestHash, r.Status, string(headers), body)
}

// LoadResponse implements ConsumerDialect for every dialect.
func (s *dialectSQL) LoadResponse(ctx context.Context, q Querier, n *Names, k idempotency.Key) (idempotency.Response, bool, error) {
	var (
		r       idempotency.Response
		headers string
	)
	found, err := scanRow(ctx, q, []any{&r.RequestHash, &r.Status, &headers, &r.Body},
		s.rebind("SELECT request_hash, status, headers, body FROM "+n.Responses+" WHERE consumer = ? AND event_id = "+s.uuidParam),
		k.Consumer, k.EventID.String())
	if err != nil || !found {
		return r, false, err
	}
	if err := json.Unmarshal([]byte(headers), &r.Header); err != nil {
		return r, false, fmt.Errorf("decoding the stored header: %w", err)
	}
	return r, true, nil
}

// maxInboxRows caps the keys of one multi-row statement: 2 parameters each stays under the
// 999 of SQLite builds before 3.32.
const maxInboxRows = 400

// uniqueKeys returns keys without repeats, sorted (so that two statements inserting
// overlapping keys take their row locks in one order and never wait for each other in a
// cycle), and each key's first index in keys.
func uniqueKeys(keys []idempotency.Key) ([]idempotency.Key, map[idempotency.Key]int) {
	first := make(map[idempotency.Key]int, len(keys))
	for i, k := range keys {
		if _, dup := first[k]; !dup {
			first[k] = i
		}
	}
	uniq := slices.SortedFunc(maps.Keys(first), func(a, b idempotency.Key) int {
		if c := strings.Compare(a.Consumer, b.Consumer); c != 0 {
			return c
		}
		return bytes.Compare(a.EventID[:], b.EventID[:])
	})
	return uniq, first
}

// keyArgs returns the (consumer, event ID text) arguments of keys, in order.
func keyArgs(keys []idempotency.Key) []any {
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, k.Consumer, k.EventID.String())
	}
	return args
}

// scanKeys reads rows of (consumer, event ID text).
func scanKeys(rows Rows) (map[idempotency.Key]bool, error) {
	defer rows.Close()
	out := map[idempotency.Key]bool{}
	for rows.Next() {
		var k idempotency.Key
		var id string
		if err := rows.Scan(&k.Consumer, &id); err != nil {
			return nil, err
		}
		var err error
		if k.EventID, err = uuid.Parse(id); err != nil {
			return nil, err
		}
		out[k] = true
	}
	return out, rows.Err()
}
