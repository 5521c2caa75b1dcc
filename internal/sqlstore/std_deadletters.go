package sqlstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
)

func (mysqlDialect) DeadLetters(db DB, n *Names) deadletter.Table {
	return classifiedTable{&stdDeadLetters{c: mysqlConsumer, db: db, n: n}, n}
}

func (sqliteDialect) DeadLetters(db DB, n *Names) deadletter.Table {
	return classifiedTable{&stdDeadLetters{c: sqliteConsumer, db: db, n: n}, n}
}

// stdDeadLetters is the dead-letter table of MySQL and SQLite.
type stdDeadLetters struct {
	c  stdConsumer
	db DB
	n  *Names
}

// columns are the dead-letter columns in scanDeadLetters order.
func (t *stdDeadLetters) columns() string {
	return `id, COALESCE(event_id, ''), event_type, event_key, ` + t.c.headers + `, content_type, body,
       created_at, stage, kind, consumer, reason, attempts, first_failed_at, last_failed_at, status,
       COALESCE(status_changed_at, '1970-01-01 00:00:00'), broker_message_id, raw, COALESCE(held_seq, 0)`
}

// writer inserts dead letters into n's table. SQLite binds times as the text its columns
// hold; its parameter limit (999 before 3.32) allows 58 rows of 17.
func (c stdConsumer) writer(n *Names) *dlWriter {
	w := &dlWriter{
		table:    n.DeadLetters,
		lim:      mysqlLimits,
		tuple:    func(int) string { return "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)" },
		time:     func(t time.Time) any { return t.UTC() },
		failTime: c.failTime,
		maxRow:   1000,
	}
	if c.d == SQLite {
		w.lim, w.maxRow = sqliteLimits, 999/dlColumnCount
		w.time = func(t time.Time) any { return t.UTC().Format(sqliteTime) }
	}
	return w
}

// Add stores e whatever its content (see the deadletter package).
func (t *stdDeadLetters) Add(ctx context.Context, e deadletter.Entry) error {
	return t.c.writer(t.n).add(ctx, t.db, e)
}

func (t *stdDeadLetters) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Entry, error) {
	where, args, limit := listWhere(f, t.c.failTime, t.c.contains)
	args = append(args, limit)
	rows, err := t.db.Query(ctx, "SELECT "+t.columns()+" FROM "+t.n.DeadLetters+
		" WHERE "+strings.Join(where, " AND ")+" ORDER BY id LIMIT ?", args...)
	if err != nil {
		return nil, err
	}
	return scanDeadLetters(rows)
}

func (t *stdDeadLetters) Get(ctx context.Context, id int64) (deadletter.Entry, error) {
	return t.get(ctx, t.db, id)
}

func (t *stdDeadLetters) get(ctx context.Context, q Querier, id int64) (deadletter.Entry, error) {
	rows, err := q.Query(ctx, "SELECT "+t.columns()+" FROM "+t.n.DeadLetters+" WHERE id = ?", id)
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
// The lock is a write that changes nothing: on MySQL it locks the row, on SQLite it takes
// the database's write lock before the read, so the read cannot go stale.
func (t *stdDeadLetters) pending(ctx context.Context, q Querier, id int64) (deadletter.Entry, error) {
	if err := q.Exec(ctx, "UPDATE "+t.n.DeadLetters+" SET status = status WHERE id = ?", id); err != nil {
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

func (t *stdDeadLetters) Replay(ctx context.Context, id int64) error {
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
		if err := t.c.d.Insert(ctx, q, t.n, []outbox.Message{m}); err != nil {
			return fmt.Errorf("deadletter: replaying %d into the outbox: %w", id, err)
		}
		return t.setStatus(ctx, q, id, deadletter.StatusReplayed)
	})
}

// releaseHeld makes the held outbox row seq due now, where it stands, marked as the replay
// of dead letter id, and reports whether the row was there, held. (The entry's lock taken by
// pending keeps concurrent replays and discards of it out.)
func (t *stdDeadLetters) releaseHeld(ctx context.Context, q Querier, seq, id int64) (bool, error) {
	held := "seq = ? AND available_at = " + heldAt(t.c.d)
	found, err := scanOne(ctx, q, nil, "SELECT 1 FROM "+t.n.Outbox+" WHERE "+held+t.c.lockRow, seq)
	if err != nil || !found {
		return false, err
	}
	return true, q.Exec(ctx, "UPDATE "+t.n.Outbox+" SET available_at = "+t.c.now+
		", attempts = 0, first_failed_at = NULL, last_error = NULL, headers = "+t.c.replayHeaders+" WHERE "+held,
		strconv.FormatInt(id, 10), seq)
}

func (t *stdDeadLetters) Discard(ctx context.Context, id int64) error {
	return t.db.InTx(ctx, func(q Querier) error {
		e, err := t.pending(ctx, q, id)
		if err != nil {
			return err
		}
		if e.HeldSeq != 0 {
			if err := q.Exec(ctx, "DELETE FROM "+t.n.Outbox+" WHERE seq = ? AND available_at = "+heldAt(t.c.d), e.HeldSeq); err != nil {
				return fmt.Errorf("deadletter: discarding %d: deleting its outbox row %d: %w", id, e.HeldSeq, err)
			}
		}
		return t.setStatus(ctx, q, id, deadletter.StatusDiscarded)
	})
}

func (t *stdDeadLetters) Prune(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("deadletter: pruning %s: limit %d is not positive", t.n.DeadLetters, limit)
	}
	ago, arg := t.c.ago(retention)
	n, err := t.c.deleteSome(ctx, t.db, t.n.DeadLetters, prunable+" AND status_changed_at < "+ago, []any{arg}, limit)
	if err != nil {
		return n, fmt.Errorf("deadletter: pruning %s: %w", t.n.DeadLetters, err)
	}
	return n, nil
}

func (t *stdDeadLetters) setStatus(ctx context.Context, q Querier, id int64, s deadletter.Status) error {
	return q.Exec(ctx, "UPDATE "+t.n.DeadLetters+" SET status = ?, status_changed_at = "+t.c.now+" WHERE id = ?", string(s), id)
}

var (
	_ ConsumerDialect = mysqlDialect{}
	_ ConsumerDialect = sqliteDialect{}
)
