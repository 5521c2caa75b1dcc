package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
)

func (d postgres) DeadLetters(db DB, n *Names) deadletter.Table {
	return classifiedTable{&pgDeadLetters{d: d, db: db, n: n}, n}
}

type pgDeadLetters struct {
	d  postgres
	db DB
	n  *Names
}

// pgDeadLetterColumns are the dead-letter columns in scanDeadLetters order.
const pgDeadLetterColumns = `id, coalesce(event_id::text, ''), event_type, event_key, coalesce(headers::text, ''),
       content_type, body, created_at, stage, kind, consumer, reason, attempts, first_failed_at,
       last_failed_at, status, coalesce(status_changed_at, 'epoch'::timestamptz), broker_message_id, raw,
       coalesce(held_seq, 0)`

// pgDeadLetterWriter inserts dead letters into n's table.
func pgDeadLetterWriter(n *Names) *dlWriter {
	return &dlWriter{
		table: n.DeadLetters,
		lim:   pgLimits,
		tuple: func(row int) string {
			o := row * dlColumnCount
			return fmt.Sprintf("($%d::uuid,$%d,$%d,$%d::jsonb,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d,$%d::bigint)",
				o+1, o+2, o+3, o+4, o+5, o+6, o+7, o+8, o+9, o+10, o+11, o+12, o+13, o+14, o+15, o+16, o+17)
		},
		time:     func(t time.Time) any { return t },
		failTime: func(t time.Time) any { return t },
		maxRow:   1000,
	}
}

// Add stores e whatever its content (see the deadletter package).
func (t *pgDeadLetters) Add(ctx context.Context, e deadletter.Entry) error {
	return pgDeadLetterWriter(t.n).add(ctx, t.db, e)
}

func (t *pgDeadLetters) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Entry, error) {
	where, args, limit := listWhere(f, func(at time.Time) any { return at }, "strpos(reason, ?) > 0")
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
		e, err := t.pending(ctx, q, id)
		if err != nil {
			return err
		}
		if e.HeldSeq != 0 {
			if err := replayableInPlace(id, e); err != nil {
				return err
			}
			// The held row, due now and marked as this replay, where it stands.
			released, err := scanOne(ctx, q, nil, "UPDATE "+t.n.Outbox+` AS o
   SET available_at = now(), attempts = 0, first_failed_at = NULL, last_error = NULL,
       headers = coalesce(o.headers, '{}'::jsonb) || jsonb_build_object('`+outbox.ReplayHeader+`', $2::text)
 WHERE o.seq = $1 AND o.available_at = `+heldAt(Postgres)+` RETURNING 1`, e.HeldSeq, strconv.FormatInt(id, 10))
			if err != nil {
				return fmt.Errorf("deadletter: replaying %d: releasing its outbox row %d: %w", id, e.HeldSeq, err)
			}
			if released {
				return t.setStatus(ctx, q, id, deadletter.StatusReplayed)
			}
			// The held row is gone (deleted by hand): the event goes in anew, as an
			// entry's that holds nothing.
		}
		m, err := forReplay(id, e)
		if err != nil {
			return err
		}
		if err := t.d.Insert(ctx, q, t.n, []outbox.Message{m}); err != nil {
			return fmt.Errorf("deadletter: replaying %d into the outbox: %w", id, err)
		}
		return t.setStatus(ctx, q, id, deadletter.StatusReplayed)
	})
}

func (t *pgDeadLetters) Discard(ctx context.Context, id int64) error {
	return t.db.InTx(ctx, func(q Querier) error {
		e, err := t.pending(ctx, q, id)
		if err != nil {
			return err
		}
		if e.HeldSeq != 0 {
			if err := q.Exec(ctx, "DELETE FROM "+t.n.Outbox+" WHERE seq = $1 AND available_at = "+heldAt(Postgres), e.HeldSeq); err != nil {
				return fmt.Errorf("deadletter: discarding %d: deleting its outbox row %d: %w", id, e.HeldSeq, err)
			}
		}
		return t.setStatus(ctx, q, id, deadletter.StatusDiscarded)
	})
}

// pending locks entry id for the rest of q's transaction and returns it if it is pending.
func (t *pgDeadLetters) pending(ctx context.Context, q Querier, id int64) (deadletter.Entry, error) {
	e, err := getDeadLetter(ctx, q, "SELECT "+pgDeadLetterColumns+" FROM "+t.n.DeadLetters+" WHERE id = $1 FOR UPDATE", id)
	if err != nil {
		return e, err
	}
	if e.Status != deadletter.StatusPending {
		return e, fmt.Errorf("%w: dead letter %d is %s", deadletter.ErrNotPending, id, e.Status)
	}
	return e, nil
}

func (t *pgDeadLetters) setStatus(ctx context.Context, q Querier, id int64, s deadletter.Status) error {
	return q.Exec(ctx, "UPDATE "+t.n.DeadLetters+" SET status = $1, status_changed_at = now() WHERE id = $2", string(s), id)
}

func (t *pgDeadLetters) Prune(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("deadletter: pruning %s: limit %d is not positive", t.n.DeadLetters, limit)
	}
	n, err := pgDeleteSome(ctx, t.db, t.n.DeadLetters, prunable+" AND status_changed_at < now() - $1 * interval '1 millisecond'",
		[]any{retention.Milliseconds()}, limit)
	if err != nil {
		return n, fmt.Errorf("deadletter: pruning %s: %w", t.n.DeadLetters, err)
	}
	return n, nil
}

// prunable matches the dead letters Prune may delete, through the (status, last_failed_at)
// index.
const prunable = "status IN ('replayed', 'discarded')"

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
// A row no longer readable as written (headers that are not a JSON object of strings, a
// time or event ID that does not parse: rows the relay copied before migration 3, rows
// edited by hand) does not fail the others: what cannot be read goes to the entry's Raw.
func scanDeadLetters(rows Rows) ([]deadletter.Entry, error) {
	defer rows.Close()
	var out []deadletter.Entry
	for rows.Next() {
		var (
			e                             deadletter.Entry
			id, hdr, stage, kind, state   string
			created, first, last, changed lenientTime
			raw                           []byte
		)
		m := &e.Message
		if err := rows.Scan(&e.ID, &id, &m.Type, &m.Key, &hdr, &m.ContentType, &m.Body, &created,
			&stage, &kind, &e.Consumer, &e.Reason, &e.Attempts, &first, &last, &state, &changed,
			&e.BrokerMessageID, &raw, &e.HeldSeq); err != nil {
			return nil, err
		}
		e.Stage, e.Kind, e.Status = deadletter.Stage(stage), deadletter.Kind(kind), deadletter.Status(state)
		e.FirstFailedAt, e.LastFailedAt, m.CreatedAt = first.t, last.t, created.t
		if changed.t.Unix() > 0 {
			e.StatusChangedAt = changed.t
		}
		if raw != nil {
			e.Raw = &deadletter.Raw{}
			if err := e.Raw.UnmarshalText(raw); err != nil {
				e.Raw = &deadletter.Raw{Body: raw} // edited by hand: kept whole
			}
		}
		unreadable := func(set func(r *deadletter.Raw)) {
			if e.Raw == nil {
				e.Raw = &deadletter.Raw{}
			}
			set(e.Raw)
		}
		if id != "" {
			var err error
			if m.ID, err = uuid.Parse(id); err != nil {
				unreadable(func(r *deadletter.Raw) { r.ID = id })
			}
		}
		if hdr != "" {
			if err := json.Unmarshal([]byte(hdr), &m.Headers); err != nil {
				m.Headers = nil
				unreadable(func(r *deadletter.Raw) { r.HeadersText = hdr })
			}
		}
		if created.err != nil {
			unreadable(func(r *deadletter.Raw) { r.CreatedAt = created.text })
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
