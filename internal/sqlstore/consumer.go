package sqlstore

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
)

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

// forReplay returns the message of dead letter e (ID id), marked as its replay (see
// outbox.ReplayHeader), ready to go back into the outbox; or an error wrapping
// deadletter.ErrNotReplayable when e cannot be rebuilt into the event it was.
func forReplay(id int64, e deadletter.Entry) (outbox.Message, error) {
	m := e.Message
	why := ""
	switch {
	case e.Kind == deadletter.KindMalformed || e.Kind == deadletter.KindUnreadableRow:
		why = fmt.Sprintf("it is %s: its envelope was never read in full", e.Kind)
	case m.ID == uuid.Nil:
		why = "it has no event ID (the message was never decoded)"
	case e.Raw != nil && changedToStore(e):
		why = "its event had to be changed to be stored (its Raw holds the original)"
	}
	if why != "" {
		return m, fmt.Errorf("%w: dead letter %d: %s", deadletter.ErrNotReplayable, id, why)
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Errorf("%w: dead letter %d: %w", deadletter.ErrNotReplayable, id, err)
	}
	m.Headers = maps.Clone(m.Headers)
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	m.Headers[outbox.ReplayHeader] = strconv.FormatInt(id, 10)
	return m, nil
}

// replayableInPlace fails, wrapping deadletter.ErrNotReplayable, for an entry holding a row
// that the relay could not read (replayed, it would only fail again: discard it, which
// releases its key, and publish the event repaired). The held row is the event as it was
// published, so an entry whose fields had to change to be stored replays in place.
func replayableInPlace(id int64, e deadletter.Entry) error {
	if e.Kind == deadletter.KindUnreadableRow || e.Kind == deadletter.KindMalformed {
		return fmt.Errorf("%w: dead letter %d: it is %s: its outbox row %d cannot be read as an event (discard it to release its key)",
			deadletter.ErrNotReplayable, id, e.Kind, e.HeldSeq)
	}
	return nil
}

// changedToStore reports whether the event of e differs from its Raw original.
func changedToStore(e deadletter.Entry) bool {
	r, m := e.Raw, e.Message
	return r.Type != m.Type || r.Key != m.Key || r.ContentType != m.ContentType ||
		r.ID != "" && r.ID != m.ID.String() || r.CreatedAt != "" || r.HeadersText != "" ||
		r.Body != nil || !maps.Equal(r.Headers, m.Headers)
}

// listWhere turns a dead-letter filter into "?"-placeholder conditions, their arguments
// and the row limit (default 100, at most 10,000). bindTime binds a time the way the dialect
// stores the table's times; contains is the dialect's condition "reason contains ?".
func listWhere(f deadletter.Filter, bindTime func(time.Time) any, contains string) (where []string, args []any, limit int) {
	add := func(cond string, v any) {
		where = append(where, cond)
		args = append(args, v)
	}
	if f.Status != "" {
		add("status = ?", string(f.Status))
	}
	if f.Stage != "" {
		add("stage = ?", string(f.Stage))
	}
	if f.Consumer != "" {
		add("consumer = ?", f.Consumer)
	}
	if f.EventType != "" {
		add("event_type = ?", f.EventType)
	}
	if f.Kind != "" {
		add("kind = ?", string(f.Kind))
	}
	if f.EventID != uuid.Nil {
		add("event_id = ?", f.EventID.String())
	}
	if f.BrokerMessageID != "" {
		add("broker_message_id = ?", f.BrokerMessageID)
	}
	if f.ReasonContains != "" {
		add(contains, f.ReasonContains)
	}
	if !f.Since.IsZero() {
		add("last_failed_at >= ?", bindTime(f.Since))
	}
	if !f.Until.IsZero() {
		add("last_failed_at < ?", bindTime(f.Until))
	}
	add("id > ?", f.AfterID)
	limit = f.Limit
	if limit <= 0 {
		limit = 100
	}
	return where, args, min(limit, 10000)
}

// scanOne runs a query expected to return at most one row of one column and reports
// whether it returned one.
func scanOne(ctx context.Context, q Querier, dest any, query string, args ...any) (bool, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	found := rows.Next()
	if found && dest != nil {
		if err := rows.Scan(dest); err != nil {
			return false, err
		}
	}
	return found, rows.Err()
}
