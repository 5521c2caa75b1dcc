package outboxpglog

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/internal/pgxdb"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// This file holds the store's statements on the table and the slot, and the administration
// of the publication and the slot (outbox migrate --log, outbox log drop).

func (s *Store) exec(ctx context.Context, sql string, args ...any) error {
	_, err := s.pool.Exec(ctx, sql, args...)
	return sqlstore.Classify(err, s.names)
}

// flushDeletes deletes the delivered streamed rows. Like the polling relay's complete, it
// does not wait for the WAL flush: a delete lost in a crash re-sends its rows. One runs at a
// time, so that a flush that returns has seen every earlier one commit: a poll that follows
// it never claims a delivered row.
//
// The log can bring a commit a moment before other sessions see it (PostgreSQL makes a
// transaction visible after its commit record is flushed, and the walsender may decode it in
// between): a delete of such a row finds nothing. Rows a delete missed stay queued for the
// next flush, for up to deleteGrace, instead of being left in the table to be sent again.
func (s *Store) flushDeletes(ctx context.Context) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	seqs := s.deletes
	s.deletes = nil
	s.mu.Unlock()
	if len(seqs) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, `WITH nosync AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM `+s.names.Outbox+` WHERE seq = ANY ($1) AND claim_token IS NULL AND EXISTS (SELECT FROM nosync)
RETURNING seq`, seqs)
	var gone []int64
	if err == nil {
		gone, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	deleted := make(map[int64]bool, len(gone))
	for _, seq := range gone {
		deleted[seq] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.deletes = append(seqs, s.deletes...)
		return sqlstore.Classify(err, s.names)
	}
	now := time.Now()
	var again []int64
	for _, seq := range seqs {
		if deleted[seq] {
			delete(s.missed, seq)
			continue
		}
		first, ok := s.missed[seq]
		switch {
		case !ok:
			s.missed[seq] = now
			again = append(again, seq)
		case now.Sub(first) < deleteGrace:
			again = append(again, seq)
		default: // gone meanwhile (replayed, discarded, deleted by hand): nothing to delete
			delete(s.missed, seq)
		}
	}
	s.deletes = append(again, s.deletes...)
	return nil
}

// flushAll flushes until no delivered row waits to be deleted, or ctx ends.
func (s *Store) flushAll(ctx context.Context) error {
	for {
		if err := s.flushDeletes(ctx); err != nil {
			return err
		}
		s.mu.Lock()
		n := len(s.deletes)
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// deleteGrace is how long a delivered row that a delete did not find is looked for again:
// far longer than a commit takes to become visible.
const deleteGrace = 2 * time.Second

// tableState is what the switch to streaming reads of the table.
type tableState struct {
	snap       snapshot       // the snapshot the rows were read in
	lsn        uint64         // the WAL position read after it
	untouched  map[int64]bool // rows never claimed, neither held nor behind a held row
	held       map[string]bool
	heldRows   int64
	streamable bool // no row is leased or waiting for a retry, and there are at most limit rows
}

// readTable reads up to limit+1 rows of the table in one snapshot, with that snapshot and
// the WAL position read after it: a streamed row whose transaction the snapshot saw
// committed was either delivered by the polls (gone) or is among the rows; any other
// streamed row is new (see cut).
func (s *Store) readTable(ctx context.Context, limit int) (tableState, error) {
	t := tableState{untouched: map[int64]bool{}, held: map[string]bool{}}
	rows, err := s.pool.Query(ctx, `WITH r AS (
SELECT seq, key, available_at = 'infinity' AS held, claim_token IS NULL AND attempts = 0 AS untouched
  FROM `+s.names.Outbox+` ORDER BY seq LIMIT $1)
SELECT pg_current_snapshot()::text, pg_current_wal_lsn()::text, r.seq, r.key, r.held, r.untouched
  FROM (SELECT) AS one LEFT JOIN r ON true`, limit+1)
	if err != nil {
		return t, err
	}
	type r struct {
		seq             int64
		key             string
		held, untouched bool
	}
	var (
		all        []r
		snap, lsn  string
		seq        *int64
		key        *string
		held, free *bool
	)
	for rows.Next() {
		if err := rows.Scan(&snap, &lsn, &seq, &key, &held, &free); err != nil {
			rows.Close()
			return t, err
		}
		if seq != nil { // nil: the left join's row of an empty table
			all = append(all, r{*seq, *key, *held, *free})
		}
	}
	if err := rows.Err(); err != nil {
		return t, err
	}
	if t.snap, err = parseSnapshot(snap); err != nil {
		return t, err
	}
	if err := (lsnScanner{&t.lsn}).Scan(lsn); err != nil {
		return t, err
	}
	if len(all) > limit {
		return t, nil
	}
	for _, x := range all {
		if x.held {
			t.held[x.key] = true
			t.heldRows++
		}
	}
	for _, x := range all {
		switch {
		case x.held:
		case t.held[x.key]: // waits behind its key's dead letter, whatever its state
		case !x.untouched:
			return t, nil // leased or waiting for a retry: the polls' business
		default:
			t.untouched[x.seq] = true
		}
	}
	t.streamable = true
	return t, nil
}

// sweep looks, while streaming, for what the log will not bring: a row that was due for
// StaleAfter and is not in the store's hands (committed while the store was not looking,
// or written by a relay that polls the same table), or a change in the held rows (a dead
// letter replayed or discarded). It reports why the store should poll, or "".
func (s *Store) sweep(ctx context.Context) (string, error) {
	// The shape CTE names every column the polls use: a table of another version fails
	// the sweep (outbox.ErrSchema) and the store polls, which report it.
	// One row even when nothing is stale (the left join), so the held rows' count needs no
	// statement of its own.
	rows, err := s.pool.Query(ctx, `WITH shape AS (SELECT seq, id, type, key, headers, content_type, body, created_at,
       available_at, attempts, claim_token, lease_owner, lease_until, first_failed_at, last_error FROM `+s.names.Outbox+` WHERE false),
stale AS (SELECT seq, key FROM `+s.names.Outbox+` WHERE available_at < now() - $1 * interval '1 millisecond' AND available_at <> 'infinity'
 ORDER BY seq LIMIT 100)
SELECT (SELECT count(*) FROM `+s.names.Outbox+` WHERE available_at = 'infinity'), stale.seq, stale.key
  FROM (SELECT) AS one LEFT JOIN stale ON true`, s.cfg.StaleAfter.Milliseconds())
	if err != nil {
		return "", sqlstore.Classify(err, s.names)
	}
	type r struct {
		seq int64
		key string
	}
	var (
		stale []r
		held  int64
		seq   *int64
		key   *string
	)
	for rows.Next() {
		if err := rows.Scan(&held, &seq, &key); err != nil {
			rows.Close()
			return "", err
		}
		if seq != nil {
			stale = append(stale, r{*seq, *key})
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode != streaming {
		return "", nil
	}
	if held != s.heldRows {
		return "a dead letter that held a key was replayed or discarded", nil
	}
	if len(stale) == 0 {
		return "", nil
	}
	mine := map[int64]bool{}
	for _, r := range s.window {
		mine[r.claimed.Seq] = true
	}
	for _, c := range s.claims {
		for seq := range c.rows {
			mine[seq] = true
		}
	}
	for _, seq := range s.deletes {
		mine[seq] = true
	}
	for _, x := range stale {
		if !mine[x.seq] && !s.held[x.key] {
			return fmt.Sprintf("row %d waited %v in the table without the log bringing it", x.seq, s.cfg.StaleAfter), nil
		}
	}
	return "", nil
}

// ReadSlot reads the state of the replication slot called slot: whether it exists and is
// read, and the WAL it retains (outbox status, and the relay's gauges through Stats).
func ReadSlot(ctx context.Context, pool *pgxpool.Pool, slot string) (outboxdriver.SlotStats, error) {
	st, err := sqlstore.ReadSlot(ctx, pgxdb.Querier{Q: pool}, slot)
	if err != nil {
		return st, fmt.Errorf("outboxpglog: %w", err)
	}
	return st, nil
}

// CreatePublication creates the publication of the outbox's inserts that the store reads
// (cfg.Publication), if it does not exist. The outbox must be migrated; `outbox migrate
// --log` does the same. It needs ownership of the outbox table.
func CreatePublication(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	c, n, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if err := sqlstore.CreatePublication(ctx, pgxdb.Querier{Q: pool}, n, c.Publication); err != nil {
		return fmt.Errorf("outboxpglog: %w", err)
	}
	return nil
}

// Drop drops the store's replication slot and publication (those of cfg), if they exist:
// for an outbox that goes back to polling, or is removed. A slot that a relay reads cannot
// be dropped: stop the relays first. `outbox log drop` does the same.
func Drop(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	c, _, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if err := sqlstore.DropLog(ctx, pgxdb.Querier{Q: pool}, c.Slot, c.Publication); err != nil {
		return fmt.Errorf("outboxpglog: %w", err)
	}
	return nil
}

// errNoPublication is the relay's error when the publication is missing.
func errNoPublication(pub string) error {
	return fmt.Errorf("%w: publication %s does not exist: run `outbox migrate --log` (or outboxpglog.CreatePublication)", outbox.ErrSchema, pub)
}

// snapshot is a pg_snapshot: which transactions it sees as committed.
type snapshot struct {
	xmin, xmax uint64
	xip        map[uint64]bool
}

// parseSnapshot parses pg_current_snapshot()'s text, "xmin:xmax:xip,xip".
func parseSnapshot(text string) (snapshot, error) {
	parts := strings.Split(text, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("outboxpglog: snapshot %q is not xmin:xmax:xip", text)
	}
	var sn snapshot
	var err error
	if sn.xmin, err = strconv.ParseUint(parts[0], 10, 64); err == nil {
		sn.xmax, err = strconv.ParseUint(parts[1], 10, 64)
	}
	if err != nil {
		return snapshot{}, fmt.Errorf("outboxpglog: snapshot %q: %w", text, err)
	}
	sn.xip = map[uint64]bool{}
	for _, x := range strings.Split(parts[2], ",") {
		if x == "" {
			continue
		}
		xid, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return snapshot{}, fmt.Errorf("outboxpglog: snapshot %q: %w", text, err)
		}
		sn.xip[xid] = true
	}
	return sn, nil
}

// sawCommitted reports whether the snapshot sees the transaction xid (32 bits, as the log
// names it) as committed: before xmin, or before xmax and not in progress. The 32-bit xid
// takes the epoch that puts it within 2^31 of xmax, as PostgreSQL compares xids.
func (sn snapshot) sawCommitted(xid uint32) bool {
	const half, wrap = 1 << 31, 1 << 32
	full := sn.xmax&^(wrap-1) | uint64(xid)
	switch {
	case full > sn.xmax+half && full >= wrap:
		full -= wrap
	case full+half < sn.xmax:
		full += wrap
	}
	return full < sn.xmin || (full < sn.xmax && !sn.xip[full])
}
