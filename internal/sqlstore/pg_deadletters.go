package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
)

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
