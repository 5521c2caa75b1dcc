package sqlstore

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
)

// This file is the dead-letter table (deadletter.Table), one implementation for every
// dialect over its fragments (dialectSQL). The relay's writes to it are writeback.go's;
// the consumer's lookup of held keys is keyhold.go's; the operator's reads whose cost does
// not grow with the entries are dlview.go's.

// deadLetters is the dead-letter table of n over db.
type deadLetters struct {
	d   Dialect
	sql *dialectSQL
	db  DB
	n   *Names
}

// newDeadLetters returns the dead-letter table of n over db, its errors classified.
func newDeadLetters(d Dialect, db DB, n *Names) deadletter.Table {
	return classifiedTable{&deadLetters{d: d, sql: d.sql(), db: db, n: n}, n}
}

var _ deadletter.KeyHolds = (*deadLetters)(nil)

// columns are the dead-letter columns in scanDeadLetters order.
func (t *deadLetters) columns() string {
	return "id, " + t.sql.eventID + ", event_type, event_key, " + t.sql.headers + `, content_type, body,
       created_at, stage, kind, consumer, reason, attempts, first_failed_at, last_failed_at, status,
       COALESCE(status_changed_at, ` + t.sql.epoch + `), broker_message_id, raw, COALESCE(held_seq, 0)`
}

// writer inserts dead letters into the table.
func (t *deadLetters) writer() dlWriter { return dlWriter{sql: t.sql, table: t.n.DeadLetters} }

// Add stores e whatever its content (see the deadletter package).
func (t *deadLetters) Add(ctx context.Context, e deadletter.Entry) error {
	return t.writer().add(ctx, t.db, e)
}

func (t *deadLetters) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Entry, error) {
	where, args, limit := listWhere(f, t.sql.bindTime, t.sql.contains)
	rows, err := t.db.Query(ctx, t.sql.rebind("SELECT "+t.columns()+" FROM "+t.n.DeadLetters+
		" WHERE "+strings.Join(where, " AND ")+" ORDER BY id LIMIT ?"), append(args, limit)...)
	if err != nil {
		return nil, err
	}
	return scanDeadLetters(rows)
}

func (t *deadLetters) Get(ctx context.Context, id int64) (deadletter.Entry, error) {
	return t.get(ctx, t.db, id)
}

func (t *deadLetters) get(ctx context.Context, q Querier, id int64) (deadletter.Entry, error) {
	rows, err := q.Query(ctx, t.sql.rebind("SELECT "+t.columns()+" FROM "+t.n.DeadLetters+" WHERE id = ?"), id)
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

// pending locks entry id for the rest of q's transaction and returns it if it is pending.
// The lock is a write that changes nothing: it locks the row (on SQLite, it takes the
// database's write lock before the read), so the read cannot go stale.
func (t *deadLetters) pending(ctx context.Context, q Querier, id int64) (deadletter.Entry, error) {
	if err := q.Exec(ctx, t.sql.rebind("UPDATE "+t.n.DeadLetters+" SET status = status WHERE id = ?"), id); err != nil {
		return deadletter.Entry{}, err
	}
	e, err := t.get(ctx, q, id)
	if err != nil {
		return e, err
	}
	if e.Status != deadletter.StatusPending {
		return e, fmt.Errorf("%w: dead letter %d is %s", deadletter.ErrNotPending, id, e.Status)
	}
	return e, nil
}

// Replay puts the entry's event back: its held row, due now where it stands (so it goes
// first), or, for an entry that holds nothing, the event anew at the end of the outbox.
func (t *deadLetters) Replay(ctx context.Context, id int64) error {
	return t.db.InTx(ctx, func(q Querier) error {
		e, err := t.pending(ctx, q, id)
		if err != nil {
			return err
		}
		if e.HeldSeq != 0 {
			if err := replayableInPlace(id, e); err != nil {
				return err
			}
			released, err := t.releaseHeld(ctx, q, e.HeldSeq, id)
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

// releaseHeld makes the held outbox row seq due now, where it stands, marked as the replay
// of dead letter id, and reports whether the row was there, held. (The entry's lock taken by
// pending keeps concurrent replays and discards of it out.)
func (t *deadLetters) releaseHeld(ctx context.Context, q Querier, seq, id int64) (bool, error) {
	held := "seq = ? AND available_at = " + t.sql.heldAt
	found, err := scanRow(ctx, q, nil, t.sql.rebind("SELECT 1 FROM "+t.n.Outbox+" WHERE "+held+t.sql.lockRows), seq)
	if err != nil || !found {
		return false, err
	}
	return true, q.Exec(ctx, t.sql.rebind("UPDATE "+t.n.Outbox+" SET available_at = "+t.sql.now+
		", attempts = 0, first_failed_at = NULL, last_error = NULL, headers = "+t.sql.replayHeaders+" WHERE "+held),
		strconv.FormatInt(id, 10), seq)
}

// Discard marks the entry discarded; the row it holds, if any, is deleted: the key moves on.
func (t *deadLetters) Discard(ctx context.Context, id int64) error {
	return t.db.InTx(ctx, func(q Querier) error {
		e, err := t.pending(ctx, q, id)
		if err != nil {
			return err
		}
		if e.HeldSeq != 0 {
			if err := q.Exec(ctx, t.sql.rebind("DELETE FROM "+t.n.Outbox+" WHERE seq = ? AND available_at = "+t.sql.heldAt), e.HeldSeq); err != nil {
				return fmt.Errorf("deadletter: discarding %d: deleting its outbox row %d: %w", id, e.HeldSeq, err)
			}
		}
		return t.setStatus(ctx, q, id, deadletter.StatusDiscarded)
	})
}

func (t *deadLetters) setStatus(ctx context.Context, q Querier, id int64, s deadletter.Status) error {
	return q.Exec(ctx, t.sql.rebind("UPDATE "+t.n.DeadLetters+" SET status = ?, status_changed_at = "+t.sql.now+" WHERE id = ?"), string(s), id)
}

// Prune deletes up to limit entries replayed or discarded longer than retention ago,
// through the (status, last_failed_at) index.
func (t *deadLetters) Prune(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("deadletter: pruning %s: limit %d is not positive", t.n.DeadLetters, limit)
	}
	ago, arg := t.sql.ago(retention)
	n, err := t.sql.deleteSome(ctx, t.db, t.n.DeadLetters, "status IN ('replayed', 'discarded') AND status_changed_at < "+ago,
		[]any{arg}, limit)
	if err != nil {
		return n, fmt.Errorf("deadletter: pruning %s: %w", t.n.DeadLetters, err)
	}
	return n, nil
}

// scanDeadLetters reads rows of the dead-letter columns, in deadLetters.columns order. A
// row no longer readable as written (headers that are not a JSON object of strings, a time
// or event ID that does not parse: rows the relay copied before migration 3, rows edited by
// hand) does not fail the others: what cannot be read goes to the entry's Raw.
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
			var err error
			if m.Headers, err = decodeHeaders(hdr); err != nil {
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

// classifiedTable is a dialect's dead-letter table whose errors are classified (see
// Classify): a consumer whose dead-letter table is down retries the message instead of
// losing it or counting the failure against it.
type classifiedTable struct {
	t deadletter.Table
	n *Names
}

func (c classifiedTable) Add(ctx context.Context, e deadletter.Entry) error {
	return Classify(c.t.Add(ctx, e), c.n)
}

func (c classifiedTable) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Entry, error) {
	es, err := c.t.List(ctx, f)
	return es, Classify(err, c.n)
}

func (c classifiedTable) Get(ctx context.Context, id int64) (deadletter.Entry, error) {
	e, err := c.t.Get(ctx, id)
	return e, Classify(err, c.n)
}

func (c classifiedTable) Replay(ctx context.Context, id int64) error {
	return Classify(c.t.Replay(ctx, id), c.n)
}

func (c classifiedTable) Discard(ctx context.Context, id int64) error {
	return Classify(c.t.Discard(ctx, id), c.n)
}

func (c classifiedTable) Prune(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	n, err := c.t.Prune(ctx, retention, limit)
	return n, Classify(err, c.n)
}

// HeldBy implements deadletter.KeyHolds: every dialect's table does.
func (c classifiedTable) HeldBy(ctx context.Context, consumer, key string, event uuid.UUID, published time.Time) (int64, error) {
	id, err := c.t.(deadletter.KeyHolds).HeldBy(ctx, consumer, key, event, published)
	return id, Classify(err, c.n)
}
