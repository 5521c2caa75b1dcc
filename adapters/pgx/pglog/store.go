// Package outboxpglog is a relay store for PostgreSQL that reads the database's write-ahead log
// instead of polling the outbox: committed outbox inserts arrive through logical replication
// (pgoutput, a publication of the outbox's inserts and a replication slot), in commit order,
// and are handed to the same relay — transports, waves, retries, dead letters, telemetry —
// without a claim statement per batch. Producers do not change: they publish with outboxpgx,
// GORM, bun or database/sql as before.
//
// The outbox table stays the source of truth. A delivered row is deleted (in bulk, every
// Config.DeleteInterval); a row that fails is written back to the table as the polling relay
// writes it, and the store polls the table (with the polling store's leases) until the table
// holds nothing the log will not bring; then it streams again. It also polls after a start,
// after the replication connection broke, and while the slot is missing. So the slot's
// position can advance past everything received: nothing is lost with the WAL, a crash at
// any point re-sends from the table, and the slot retains next to no WAL even while the
// broker is down. See docs/log-relay.md.
//
//	store, err := outboxpglog.NewStore(pool, nil) // outbox migrate --log created the publication
//	r, err := relay.New(store, sender, nil)
//	err = r.Run(ctx)
//
// One relay process reads the slot at a time (an advisory lock and the slot itself make
// sure); others wait as standbys and take over within Config.StandbyRetry of its death.
package outboxpglog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/internal/pgxdb"
	"github.com/txoutbox/outbox/internal/config"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Config configures a [Store]. The zero value (or nil) means the defaults below.
type Config struct {
	// Tables names the outbox, as for outboxpgx.New. Default: the default names.
	Tables outbox.Tables
	// Slot is the logical replication slot the store reads; the store creates it when it
	// is missing. Publication is the publication of the outbox's inserts (outbox migrate
	// --log, or [CreatePublication]). Both: lower-case letters, digits and _, at most 63.
	// Default for both: "txoutbox_" followed by the schema and "_" (if any) and the outbox
	// table's name, lower-cased.
	Slot, Publication string
	// StandbyRetry is how often a store whose slot another relay reads tries to take it
	// over. Default 1s.
	StandbyRetry time.Duration
	// DeleteInterval is how long delivered rows wait before they are deleted together, in
	// one statement. Default 100ms: at 1k events/s, 10 statements a second instead of 100
	// (measured: the relay's own backends 11 µs/event instead of 71). A crash re-sends what
	// was delivered in the last DeleteInterval.
	DeleteInterval time.Duration
	// MaxBuffered bounds the streamed events the store holds in memory: past it (a broker
	// that is slow or down), it leaves them in the table and polls. Default 10000.
	MaxBuffered int
	// SweepInterval is how often a streaming store looks at the table for what the log
	// will not bring (a dead letter replayed or discarded, a row that waited StaleAfter),
	// one indexed statement each. Defaults 1s and 10s.
	SweepInterval, StaleAfter time.Duration
	// MaxSlotLag is how far (bytes of WAL) the slot may be behind the server when the store
	// starts reading it. A slot further behind — a relay stopped while producers went on —
	// is dropped and created again at the server's position instead of decoded: the table
	// holds every undelivered event, and reading it is cheaper than decoding its WAL
	// (measured before: a 100k-event backlog, 25 MiB of WAL, drained at 0.63 of polling's rate
	// through the old slot, 1.09 through a new one). Default 16 MiB; negative: never.
	MaxSlotLag int64
	// Logger receives the store's logs (mode changes, a lost slot, a take-over). Default
	// slog.Default().
	Logger *slog.Logger
}

// withDefaults returns a copy of c (nil allowed) with every unset field at its default, and
// the outbox's names.
func (c *Config) withDefaults() (Config, *sqlstore.Names, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	n, err := sqlstore.NewNames(sqlstore.Postgres, out.Tables)
	if err != nil {
		return out, nil, err
	}
	def := sqlstore.DefaultLogName(n)
	config.Default(&out.Slot, def)
	config.Default(&out.Publication, def)
	config.Default(&out.StandbyRetry, time.Second)
	config.Default(&out.DeleteInterval, 100*time.Millisecond)
	config.Default(&out.MaxBuffered, 10000)
	config.Default(&out.SweepInterval, time.Second)
	config.Default(&out.StaleAfter, 10*time.Second)
	config.Default(&out.MaxSlotLag, 16<<20)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	errs := []error{sqlstore.CheckLogName("Slot", out.Slot), sqlstore.CheckLogName("Publication", out.Publication)}
	if out.StandbyRetry <= 0 || out.DeleteInterval <= 0 || out.SweepInterval <= 0 || out.StaleAfter <= 0 {
		errs = append(errs, errors.New("StandbyRetry, DeleteInterval, SweepInterval and StaleAfter must be positive"))
	}
	if out.MaxBuffered < 1 {
		errs = append(errs, fmt.Errorf("MaxBuffered %d is below 1", out.MaxBuffered))
	}
	if err := errors.Join(errs...); err != nil {
		return out, nil, fmt.Errorf("outboxpglog: invalid Config: %w", err)
	}
	return out, n, nil
}

// mode is what the store does with a claim.
type mode int

const (
	// standby: the store does not hold the slot (another relay reads it, or it has not
	// taken it yet): claims return nothing.
	standby mode = iota
	// polling: claims are the polling store's. The stream's rows are kept in a sliding
	// window, for the switch to streaming.
	polling
	// streaming: claims take the stream's rows from memory; nothing is leased in the table.
	streaming
	// leaving: from streaming to polling. Claims return nothing until every streamed claim
	// was written back and the delivered rows deleted: a poll must not claim a row that a
	// streamed claim is sending.
	leaving
)

// detail names the mode for the logs, leaving (streaming → polling) apart.
func (m mode) detail() string {
	if m == leaving {
		return "leaving-stream"
	}
	return m.String()
}

func (m mode) String() string {
	switch m {
	case polling, leaving:
		return "poll"
	case streaming:
		return "stream"
	}
	return "standby"
}

// row is an outbox row the stream brought.
type row struct {
	n       uint64 // arrival order
	lsn     uint64 // end of its transaction's commit record
	xid     uint32 // its transaction
	claimed outboxdriver.Claimed
}

// streamedClaim is a claim of streamed rows: its rows by seq, until they are written back.
type streamedClaim struct {
	owner string
	lease time.Duration
	until time.Time
	rows  map[int64]row
}

// Store is a relay store that reads the outbox's inserts from PostgreSQL's log; see the
// package documentation. It implements outboxdriver.Store, Runner (the relay runs its
// stream), Validator and StatsReader.
type Store struct {
	poll   outboxdriver.Store // the polling store over the same table
	pool   *pgxpool.Pool
	names  *sqlstore.Names
	cfg    Config
	log    *slog.Logger
	lockID int64 // the advisory lock of the slot's reader

	flushMu   sync.Mutex // one flushDeletes at a time
	mu        sync.Mutex
	mode      mode
	streamUp  bool                     // the replication stream is read
	window    []row                    // streamed rows in commit order: the queue (streaming), the last MaxBuffered (otherwise)
	arrivals  uint64                   // rows the stream brought
	received  uint64                   // the stream's position: every commit before it was read
	claims    map[int64]*streamedClaim // streamed claims by token
	busyKeys  map[string]int           // keys of streamed rows in flight
	polls     int                      // polling claims running
	switching bool                     // a switch to streaming is being decided
	lastTry   time.Time
	lastPoll  time.Time // the last polling claim began
	backlog   int       // rows claimed by the polls since one last came back short
	paused    bool      // the stream is closed while the polls drain a backlog
	endStream func()    // closes the running stream (nil when none runs)
	cut       cut
	held      map[string]bool // keys held by a dead letter when streaming began
	heldRows  int64
	deletes   []int64             // delivered streamed rows to delete
	missed    map[int64]time.Time // rows a delete did not find yet, since when (flushDeletes)
	wakes     []func()
	running   bool
	changed   chan struct{} // a streamed claim was written back (for leaving)
	syncs     atomic.Int32  // Sync calls waiting: the stream asks the server for its position
}

// cut is what the switch to streaming learned: a streamed row of a transaction that the
// switch's snapshot saw committed was delivered by the polls (it is gone from the table)
// unless the table still held it (seqs); any other row is new. Rows committed after lsn,
// read after the snapshot, are all new: the cut ends there.
type cut struct {
	lsn  uint64
	snap snapshot
	seqs map[int64]bool
}

// delivered reports whether the cut says the polls delivered r.
func (c cut) delivered(r row) bool {
	return c.seqs != nil && r.lsn <= c.lsn && c.snap.sawCommitted(r.xid) && !c.seqs[r.claimed.Seq]
}

var (
	_ outboxdriver.Store       = (*Store)(nil)
	_ outboxdriver.Runner      = (*Store)(nil)
	_ outboxdriver.Validator   = (*Store)(nil)
	_ outboxdriver.StatsReader = (*Store)(nil)
)

// NewStore returns the log-reading store of the outbox cfg.Tables names, over pool. The
// pool's role must have the REPLICATION attribute (or be a superuser); the server needs
// wal_level = logical. Nothing is read before the relay runs it.
func NewStore(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("outboxpglog: NewStore needs a *pgxpool.Pool, got nil")
	}
	c, n, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	o, err := outboxpgx.New(c.Tables)
	if err != nil {
		return nil, err
	}
	poll, err := o.NewStore(pool)
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte("txoutbox log relay " + c.Slot))
	return &Store{poll: poll, pool: pool, names: n, cfg: c, log: c.Logger, lockID: int64(h.Sum64()),
		claims: map[int64]*streamedClaim{}, busyKeys: map[string]int{}, missed: map[int64]time.Time{}, changed: make(chan struct{}, 1)}, nil
}

// Mode says what the store does now: "stream", "poll" or "standby" (see outboxdriver.SlotStats).
func (s *Store) Mode() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode.String()
}

// Claim hands out streamed rows while streaming, the polling store's claims while polling,
// and nothing on standby or while leaving streaming.
func (s *Store) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	s.expire(ctx)
	s.mu.Lock()
	if s.mode == leaving && len(s.claims) == 0 {
		s.mu.Unlock()
		if err := s.flushDeletes(ctx); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if s.mode == leaving && len(s.claims) == 0 && len(s.deletes) == 0 {
			s.setModeLocked(polling, "the streamed claims are written back")
		}
	}
	switch {
	case s.mode == streaming:
		defer s.mu.Unlock()
		return s.takeLocked(p), nil
	case s.mode != polling || s.switching:
		s.mu.Unlock()
		return nil, nil
	}
	s.polls++
	s.lastPoll = time.Now()
	s.mu.Unlock()
	claimed, err := s.poll.Claim(ctx, p)
	s.mu.Lock()
	s.polls--
	if err == nil {
		s.noteBacklogLocked(len(claimed), p.Limit)
	}
	s.mu.Unlock()
	if err == nil && len(claimed) == 0 {
		s.trySwitch(ctx, 10*time.Millisecond)
	}
	return claimed, err
}

// noteBacklogLocked counts a poll's rows toward a backlog (polls that come back full) and
// closes the stream once the backlog passes MaxBuffered rows: the walsender would decode
// every row the drain leases and deletes, on the cores the drain needs, for nothing
// (measured: a 1M backlog drained at 0.77–0.80 of polling's rate, 580 MiB of WAL). The
// stream loop drops the slot, so it keeps no WAL meanwhile, and opens the stream on a new
// one when a poll comes back short.
func (s *Store) noteBacklogLocked(n, limit int) {
	if n < limit {
		s.backlog = 0
		s.paused = false
		return
	}
	s.backlog += n
	if s.backlog > s.cfg.MaxBuffered && !s.paused && s.endStream != nil {
		s.paused = true
		s.log.Info("outbox relay: the log reader closes the stream and drops its slot while it polls a backlog", "slot", s.cfg.Slot, "rows", s.backlog)
		s.endStream()
	}
}

// takeLocked takes up to p.Limit streamed rows in commit order, skipping the keys that
// other claims have in flight (a claim may take several rows of a key: the relay sends them
// in order).
func (s *Store) takeLocked(p outboxdriver.ClaimParams) []outboxdriver.Claimed {
	var (
		out     []outboxdriver.Claimed
		rows    map[int64]row
		blocked map[string]bool
		mine    map[string]bool // keys this claim took
		keep    = s.window[:0]
	)
	for i, r := range s.window {
		if len(out) == p.Limit {
			keep = append(keep, s.window[i:]...)
			break
		}
		k := r.claimed.Message.Key
		if k != "" && ((s.busyKeys[k] > 0 && !mine[k]) || blocked[k]) {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[k] = true
			keep = append(keep, r)
			continue
		}
		if rows == nil {
			rows = make(map[int64]row, min(p.Limit, len(s.window)))
		}
		if k != "" {
			if mine == nil {
				mine = map[string]bool{}
			}
			mine[k] = true
			s.busyKeys[k]++
		}
		rows[r.claimed.Seq] = r
		out = append(out, r.claimed)
	}
	clear(s.window[len(keep):])
	s.window = keep
	if len(out) > 0 {
		s.claims[p.Token] = &streamedClaim{owner: p.Owner, lease: p.Lease, until: time.Now().Add(p.Lease), rows: rows}
	}
	return out
}

// settle removes seqs from the streamed claim token and returns their rows; ok is false when
// token is not a streamed claim of this store (a poll's, or one whose lease expired).
func (s *Store) settleLocked(token int64, seqs []int64) (rows []row, ok bool) {
	c, ok := s.claims[token]
	if !ok {
		return nil, false
	}
	for _, seq := range seqs {
		r, ok := c.rows[seq]
		if !ok {
			continue
		}
		delete(c.rows, seq)
		if k := r.claimed.Message.Key; k != "" {
			if s.busyKeys[k]--; s.busyKeys[k] <= 0 {
				delete(s.busyKeys, k)
			}
		}
		rows = append(rows, r)
	}
	if len(c.rows) == 0 {
		delete(s.claims, token)
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	return rows, true
}

// Complete deletes delivered rows: a streamed claim's together with others' after
// DeleteInterval (a crash before then re-sends them from the table), a poll's at once.
func (s *Store) Complete(ctx context.Context, token int64, seqs []int64) error {
	s.mu.Lock()
	rows, ok := s.settleLocked(token, seqs)
	for _, r := range rows {
		s.deletes = append(s.deletes, r.claimed.Seq)
	}
	s.mu.Unlock()
	if ok {
		return nil
	}
	return s.poll.Complete(ctx, token, seqs)
}

// Retry writes a streamed claim's failures back to the table as the polling store does, and
// leaves streaming: the table now holds a row the log will not bring again, and the polls
// keep its key's order.
func (s *Store) Retry(ctx context.Context, token int64, retries []outboxdriver.Retry) error {
	seqs := make([]int64, len(retries))
	for i, r := range retries {
		seqs[i] = r.Seq
	}
	if err := s.adopt(ctx, token, seqs, "a send failed"); err != nil {
		return err
	}
	return s.poll.Retry(ctx, token, retries)
}

// DeadLetter moves messages to the dead letters as the polling store does (a streamed
// claim's rows are first leased to token in the table), and leaves streaming.
func (s *Store) DeadLetter(ctx context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	seqs := make([]int64, len(dead))
	for i, d := range dead {
		seqs[i] = d.Seq
	}
	if err := s.adopt(ctx, token, seqs, "a message was dead-lettered"); err != nil {
		return nil, err
	}
	return s.poll.DeadLetter(ctx, token, dead)
}

// Release gives rows back unsent: a streamed claim's go back to the queue where they stood
// (or stay in the table for the polls, when the store stopped streaming), a poll's to the
// table.
func (s *Store) Release(ctx context.Context, token int64, seqs []int64) error {
	s.mu.Lock()
	rows, ok := s.settleLocked(token, seqs)
	if ok && s.mode == streaming && len(rows) > 0 {
		slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(a.n, b.n) })
		merged := make([]row, 0, len(rows)+len(s.window))
		i, j := 0, 0
		for i < len(rows) || j < len(s.window) {
			if j == len(s.window) || (i < len(rows) && rows[i].n < s.window[j].n) {
				merged = append(merged, rows[i])
				i++
			} else {
				merged = append(merged, s.window[j])
				j++
			}
		}
		s.window = merged
	}
	s.mu.Unlock()
	if ok {
		return nil
	}
	return s.poll.Release(ctx, token, seqs)
}

// adopt makes the streamed rows seqs of token rows of the polling store's claim token (leased
// in the table, an attempt counted), so that its write-backs apply to them, and leaves
// streaming first, so that no later row of their keys is handed out meanwhile. For a token
// that is not a streamed claim it does nothing.
func (s *Store) adopt(ctx context.Context, token int64, seqs []int64, why string) error {
	s.mu.Lock()
	c, ok := s.claims[token]
	if !ok {
		s.mu.Unlock()
		return nil
	}
	owner, lease := c.owner, c.lease
	if s.mode == streaming {
		s.setModeLocked(leaving, why)
	}
	s.mu.Unlock()
	err := s.exec(ctx, `UPDATE `+s.names.Outbox+`
   SET claim_token = $1, lease_owner = $2, lease_until = now() + $3 * interval '1 millisecond', attempts = attempts + 1
 WHERE seq = ANY ($4) AND claim_token IS NULL`, token, owner, lease.Milliseconds(), seqs)
	s.mu.Lock()
	s.settleLocked(token, seqs) // written back or not, the polls have them now
	s.mu.Unlock()
	return err
}

// expire ends the streamed claims whose lease passed (their relay hung or died without a
// write-back), as an expired lease does in the table: an attempt is counted on their rows,
// and the store leaves streaming so that the polls claim them again.
func (s *Store) expire(ctx context.Context) {
	s.mu.Lock()
	var lost []int64
	now := time.Now()
	for token, c := range s.claims {
		if now.Before(c.until) {
			continue
		}
		seqs := make([]int64, 0, len(c.rows))
		for seq := range c.rows {
			seqs = append(seqs, seq)
		}
		s.settleLocked(token, seqs)
		lost = append(lost, seqs...)
	}
	if len(lost) > 0 && s.mode == streaming {
		s.setModeLocked(leaving, "a streamed claim's lease expired without a write-back")
	}
	s.mu.Unlock()
	if len(lost) == 0 {
		return
	}
	// Best effort, like a lease that expires: if the database is down the attempt goes
	// uncounted.
	_ = s.exec(context.WithoutCancel(ctx), `UPDATE `+s.names.Outbox+` SET attempts = attempts + 1 WHERE seq = ANY ($1) AND claim_token IS NULL`, lost)
}

// setModeLocked changes the mode and logs why.
func (s *Store) setModeLocked(m mode, why string) {
	if s.mode == m {
		return
	}
	if m == leaving {
		s.cut, s.held = cut{}, nil
	}
	s.log.Info("outbox relay: log reader changes mode", "slot", s.cfg.Slot, "from", s.mode.detail(), "to", m.detail(), "reason", why)
	s.mode = m
	if m == streaming {
		s.wakeLocked()
	}
}

func (s *Store) wakeLocked() {
	for _, w := range s.wakes {
		w()
	}
}

// trySwitch starts streaming when the table holds nothing the stream will not bring: every
// row still there is held by a dead letter, behind one, or in the stream's window, and no
// row is leased or waiting for a retry. The stream's rows committed before the position read
// first were delivered by the polls unless the table still holds them (the cut).
// It tries at most once every interval, and only when no poll is claiming.
func (s *Store) trySwitch(ctx context.Context, interval time.Duration) {
	s.mu.Lock()
	try := s.polls == 0 && s.mode == polling && s.streamUp && !s.switching && time.Since(s.lastTry) >= interval
	if try {
		s.switching, s.lastTry = true, time.Now()
	}
	s.mu.Unlock()
	if !try {
		return
	}
	defer func() {
		s.mu.Lock()
		s.switching = false
		s.mu.Unlock()
	}()
	t, err := s.readTable(ctx, s.cfg.MaxBuffered)
	if err != nil || !t.streamable {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode != polling || s.polls > 0 || !s.streamUp {
		return
	}
	inWindow := make(map[int64]bool, len(s.window))
	for _, r := range s.window {
		inWindow[r.claimed.Seq] = true
	}
	for seq := range t.untouched {
		if !inWindow[seq] {
			return // the stream has not brought it yet (or dropped it): poll on
		}
	}
	c := cut{lsn: t.lsn, snap: t.snap, seqs: t.untouched}
	keep := s.window[:0]
	for _, r := range s.window {
		if !c.delivered(r) && !t.held[r.claimed.Message.Key] {
			delete(c.seqs, r.claimed.Seq)
			keep = append(keep, r)
		}
	}
	clear(s.window[len(keep):])
	s.window = keep
	s.cut = c
	if s.received > t.lsn {
		s.cut = cut{}
	}
	s.held, s.heldRows = t.held, t.heldRows
	s.setModeLocked(streaming, "the table holds nothing the log will not bring")
}

// admit is what the stream does with a row it brought: queue it when streaming (unless the
// cut says the polls delivered it, or its key is held), keep it in the window otherwise.
func (s *Store) admitLocked(r row) {
	if s.mode == streaming {
		if s.cut.delivered(r) {
			return
		}
		delete(s.cut.seqs, r.claimed.Seq)
		if s.held[r.claimed.Message.Key] {
			return
		}
	}
	s.window = append(s.window, r)
	if len(s.window) <= s.cfg.MaxBuffered {
		return
	}
	if s.mode == streaming {
		s.setModeLocked(leaving, fmt.Sprintf("more than MaxBuffered (%d) events wait to be sent", s.cfg.MaxBuffered))
	}
	drop := len(s.window) - s.cfg.MaxBuffered
	clear(s.window[:drop])
	s.window = s.window[drop:]
}

// Sync waits until the store has read the log up to the end of the WAL when Sync was
// called — every transaction committed before the call is in its hands (or the store polls,
// and the table has it) — and deletes the rows delivered so far. For tests and tools that
// claim, or count the table, right after a commit or a delivery.
func (s *Store) Sync(ctx context.Context) error {
	var end uint64
	if err := s.pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(lsnScanner{&end}); err != nil {
		return err
	}
	s.syncs.Add(1)
	defer s.syncs.Add(-1)
	for {
		s.mu.Lock()
		done := !s.streamUp || s.mode != streaming || s.received >= end
		s.mu.Unlock()
		if done {
			return s.flushAll(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Resync makes the store forget what the log brought and poll the table until it holds
// nothing the log will not bring: call it after changing outbox rows by hand (UPDATE), which
// the log does not carry — a streaming store sends a row as it was inserted.
func (s *Store) Resync(ctx context.Context) error {
	if err := s.Sync(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == streaming {
		s.setModeLocked(leaving, "Resync")
	}
	clear(s.window)
	s.window = s.window[:0]
	return nil
}

// Stats is the polling store's, with the slot's state.
func (s *Store) Stats(ctx context.Context) (outboxdriver.Stats, error) {
	st, err := s.poll.(outboxdriver.StatsReader).Stats(ctx)
	if err != nil {
		return st, err
	}
	slot, err := sqlstore.ReadSlot(ctx, pgxdb.Querier{Q: s.pool}, s.cfg.Slot)
	if err != nil {
		return st, err
	}
	slot.Mode = s.Mode()
	st.Slot = &slot
	return st, nil
}

// Validate checks the outbox's schema as the polling store does.
func (s *Store) Validate(ctx context.Context) error {
	return s.poll.(outboxdriver.Validator).Validate(ctx)
}
