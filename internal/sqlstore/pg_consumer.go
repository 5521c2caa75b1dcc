package sqlstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
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

func (d postgres) DeadLetters(db DB, n *Names) deadletter.Table {
	return &pgDeadLetters{d: d, db: db, n: n}
}

type pgDeadLetters struct {
	d  postgres
	db DB
	n  *Names
}

const pgDeadLetterColumns = `id, event_id::text, event_type, event_key, coalesce(headers::text, ''), content_type, body,
       created_at, stage, consumer, reason, attempts, first_failed_at, last_failed_at, status,
       coalesce(status_changed_at, 'epoch'::timestamptz)`

func (t *pgDeadLetters) Add(ctx context.Context, e deadletter.Entry) error {
	m := e.Message
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now().UTC()
	}
	if m.Body == nil {
		m.Body = []byte{}
	}
	return t.db.Exec(ctx, `INSERT INTO `+t.n.DeadLetters+` (event_id, event_type, event_key, headers, content_type,
    body, created_at, stage, consumer, reason, attempts, first_failed_at, last_failed_at)
VALUES ($1::uuid, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		m.ID.String(), m.Type, m.Key, HeadersJSON(m.Headers), m.ContentType, m.Body, m.CreatedAt,
		string(e.Stage), e.Consumer, e.Reason, e.Attempts, e.FirstFailedAt, e.LastFailedAt)
}

func (t *pgDeadLetters) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Entry, error) {
	where, args, limit := listWhere(f, func(at time.Time) any { return at })
	for i := range where { // PostgreSQL numbers its placeholders
		where[i] = strings.Replace(where[i], "?", "$"+strconv.Itoa(i+1), 1)
	}
	args = append(args, limit)
	rows, err := t.db.Query(ctx, "SELECT "+pgDeadLetterColumns+" FROM "+t.n.DeadLetters+
		" WHERE "+strings.Join(where, " AND ")+" ORDER BY id LIMIT $"+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, err
	}
	return scanDeadLetters(rows)
}

func (t *pgDeadLetters) Get(ctx context.Context, id int64) (deadletter.Entry, error) {
	return getDeadLetter(ctx, t.db, "SELECT "+pgDeadLetterColumns+" FROM "+t.n.DeadLetters+" WHERE id = $1", id)
}

func (t *pgDeadLetters) Replay(ctx context.Context, id int64) error {
	return t.db.InTx(ctx, func(q Querier) error {
		e, err := getDeadLetter(ctx, q, "SELECT "+pgDeadLetterColumns+" FROM "+t.n.DeadLetters+" WHERE id = $1 FOR UPDATE", id)
		if err != nil {
			return err
		}
		if e.Status != deadletter.StatusPending {
			return fmt.Errorf("%w: dead letter %d is %s", deadletter.ErrNotPending, id, e.Status)
		}
		m, err := forReplay(id, e.Message)
		if err != nil {
			return err
		}
		if err := t.d.Insert(ctx, q, t.n, []outbox.Message{m}); err != nil {
			return fmt.Errorf("deadletter: replaying %d into the outbox: %w", id, err)
		}
		return q.Exec(ctx, "UPDATE "+t.n.DeadLetters+" SET status = 'replayed', status_changed_at = now() WHERE id = $1", id)
	})
}

func (t *pgDeadLetters) Discard(ctx context.Context, id int64) error {
	ok, err := scanOne(ctx, t.db, nil, "UPDATE "+t.n.DeadLetters+
		" SET status = 'discarded', status_changed_at = now() WHERE id = $1 AND status = 'pending' RETURNING 1", id)
	if err != nil || ok {
		return err
	}
	e, err := t.Get(ctx, id)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: dead letter %d is %s", deadletter.ErrNotPending, id, e.Status)
}

func getDeadLetter(ctx context.Context, q Querier, query string, id int64) (deadletter.Entry, error) {
	rows, err := q.Query(ctx, query, id)
	if err != nil {
		return deadletter.Entry{}, err
	}
	es, err := scanDeadLetters(rows)
	if err != nil {
		return deadletter.Entry{}, err
	}
	if len(es) == 0 {
		return deadletter.Entry{}, fmt.Errorf("%w: %d", deadletter.ErrNotFound, id)
	}
	return es[0], nil
}

// scanDeadLetters reads rows of the dead-letter columns, in pgDeadLetterColumns order.
func scanDeadLetters(rows Rows) ([]deadletter.Entry, error) {
	defer rows.Close()
	var out []deadletter.Entry
	for rows.Next() {
		var (
			e                     deadletter.Entry
			id, hdr, stage, state string
			changed               time.Time
		)
		m := &e.Message
		if err := rows.Scan(&e.ID, &id, &m.Type, &m.Key, &hdr, &m.ContentType, &m.Body, &m.CreatedAt,
			&stage, &e.Consumer, &e.Reason, &e.Attempts, &e.FirstFailedAt, &e.LastFailedAt, &state, &changed); err != nil {
			return nil, err
		}
		m.ID, _ = uuid.Parse(id) // the column is a uuid; a malformed message keeps the nil ID
		if hdr != "" {
			if err := json.Unmarshal([]byte(hdr), &m.Headers); err != nil {
				return nil, errors.Join(fmt.Errorf("dead letter %d has invalid headers", e.ID), err)
			}
		}
		e.Stage, e.Status = deadletter.Stage(stage), deadletter.Status(state)
		m.CreatedAt, e.FirstFailedAt, e.LastFailedAt = m.CreatedAt.UTC(), e.FirstFailedAt.UTC(), e.LastFailedAt.UTC()
		if changed.Unix() > 0 {
			e.StatusChangedAt = changed.UTC()
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
