package outboxpglog

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/internal/pgxdb"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// This file is the store's Runner: it takes the reader's advisory lock (or waits as a
// standby), reads the slot, and keeps the table in step (deletes, sweeps, scheduled events).

// statusInterval is how often the stream confirms its position to the server.
const statusInterval = time.Second

// errLockLost ends a leadership whose advisory lock's connection broke.
var errLockLost = errors.New("the connection holding the log reader's lock broke")

// Run reads the outbox's log while ctx lasts (outboxdriver.Runner): relay.Run calls it. It
// returns nil when ctx ends, and an error wrapping outbox.ErrSchema when the publication
// does not exist. A second call while one runs adds its wake and waits for ctx.
func (s *Store) Run(ctx context.Context, wake func()) error {
	s.mu.Lock()
	if wake != nil {
		s.wakes = append(s.wakes, wake)
	}
	if s.running {
		s.mu.Unlock()
		<-ctx.Done()
		return nil
	}
	s.running = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running, s.wakes = false, nil
		s.mu.Unlock()
	}()
	for ctx.Err() == nil {
		err := s.lead(ctx)
		if errors.Is(err, outbox.ErrSchema) {
			return err
		}
		if err != nil && ctx.Err() == nil {
			s.log.Warn("outbox relay: log reader lost the lead; retrying", "slot", s.cfg.Slot, "err", err)
		}
		sleep(ctx, s.cfg.StandbyRetry)
	}
	return nil
}

// lead takes the reader's lock, or returns nil at once when another relay holds it. Holding
// it, it polls and streams until ctx ends or the lock's connection breaks; then it stops
// handing out claims, waits for the streamed ones to be written back, deletes what was
// delivered, and only then lets go of the slot and the lock, so that a standby that takes
// over never sends a row this store is still sending.
func (s *Store) lead(ctx context.Context) error {
	lockConn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer lockConn.Close(context.WithoutCancel(ctx))
	var got bool
	if err := lockConn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", s.lockID).Scan(&got); err != nil || !got {
		return err // another relay reads the slot: stay a standby
	}
	if err := s.checkPublication(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.setModeLocked(polling, "this relay took the slot's lock")
	s.wakeLocked()
	s.mu.Unlock()

	leadCtx, endLead := context.WithCancelCause(ctx)
	defer endLead(nil)
	streamCtx, endStream := context.WithCancel(context.WithoutCancel(ctx))
	streamDone := make(chan struct{})
	go func() {
		defer close(streamDone)
		s.streamLoop(streamCtx, leadCtx)
	}()
	err = s.maintain(leadCtx, lockConn)

	// Hand over: no new claims, the streamed ones written back (or expired), the delivered
	// rows deleted, then the slot and the lock let go.
	s.mu.Lock()
	s.setModeLocked(standby, "this relay lets go of the slot")
	s.mu.Unlock()
	s.drainClaims(ctx)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if ferr := s.flushAll(fctx); ferr != nil {
		s.log.Warn("outbox relay: delivered rows left in the outbox (they will be sent again)", "slot", s.cfg.Slot, "err", ferr)
	}
	cancel()
	endStream()
	<-streamDone
	s.awaitSlotInactive(context.WithoutCancel(ctx))
	s.mu.Lock()
	s.window, s.cut = nil, cut{}
	s.backlog, s.paused = 0, false
	s.mu.Unlock()
	return err
}

// awaitSlotInactive waits (up to 5s) until the server has ended the walsender of the
// closed replication connection: once Run returns, the slot is free for a standby, or to
// be dropped.
func (s *Store) awaitSlotInactive(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		var active bool
		err := s.pool.QueryRow(ctx, "SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)", s.cfg.Slot).Scan(&active)
		if err != nil || !active {
			return
		}
		sleep(ctx, 10*time.Millisecond)
	}
}

// checkPublication fails with an error wrapping outbox.ErrSchema when the publication is
// missing.
func (s *Store) checkPublication(ctx context.Context) error {
	exists, err := sqlstore.PublicationExists(ctx, pgxdb.Querier{Q: s.pool}, s.cfg.Publication)
	switch {
	case err != nil:
		return err
	case !exists:
		return errNoPublication(s.cfg.Publication)
	}
	return nil
}

// drainClaims waits until every streamed claim was written back or its lease expired.
func (s *Store) drainClaims(ctx context.Context) {
	for {
		s.expire(ctx)
		s.mu.Lock()
		n := len(s.claims)
		s.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-s.changed:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// maintain deletes delivered rows every DeleteInterval; while streaming it moves scheduled
// events that fell due and sweeps the table every SweepInterval; and it checks that the
// lock's connection lives. It returns when ctx ends (nil) or the lock is lost.
func (s *Store) maintain(ctx context.Context, lockConn *pgx.Conn) error {
	tick := time.NewTicker(s.cfg.DeleteInterval)
	defer tick.Stop()
	nextSweep := time.Now().Add(s.cfg.SweepInterval)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := s.flushDeletes(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("outbox relay: deleting delivered rows failed; retrying", "slot", s.cfg.Slot, "err", err)
		}
		s.expire(ctx)
		s.mu.Lock()
		streamingNow := s.mode == streaming
		idle := time.Since(s.lastPoll) > time.Second
		s.mu.Unlock()
		if idle { // no relay claims, so none tries the switch (a claim that finds nothing does)
			s.trySwitch(ctx, 100*time.Millisecond)
		}
		if streamingNow {
			if err := sqlstore.MoveDue(ctx, s.poll); err != nil && ctx.Err() == nil {
				s.log.Warn("outbox relay: moving scheduled events failed; retrying", "slot", s.cfg.Slot, "err", err)
			}
		}
		if time.Now().Before(nextSweep) {
			continue
		}
		nextSweep = time.Now().Add(s.cfg.SweepInterval)
		if err := lockConn.Ping(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%w: %w", errLockLost, err)
		}
		if !streamingNow {
			continue
		}
		why, err := s.sweep(ctx)
		if errors.Is(err, outbox.ErrSchema) {
			why = err.Error() // the polls report it to the relay
		} else if err != nil {
			continue
		}
		if why != "" {
			s.mu.Lock()
			s.setModeLocked(leaving, why)
			s.mu.Unlock()
		}
	}
}

// streamLoop reads the slot until ctx ends, reconnecting after StandbyRetry when the
// stream breaks (the store polls meanwhile), and at once after the polls drained a backlog
// (noteBacklogLocked). leadCtx ending stops reconnecting.
func (s *Store) streamLoop(ctx, leadCtx context.Context) {
	for ctx.Err() == nil && leadCtx.Err() == nil {
		for s.streamPaused() && ctx.Err() == nil && leadCtx.Err() == nil {
			sleep(ctx, 50*time.Millisecond)
		}
		sctx, endStream := context.WithCancel(ctx)
		s.mu.Lock()
		s.endStream = endStream
		s.mu.Unlock()
		err := s.stream(sctx)
		closedForBacklog := sctx.Err() != nil && ctx.Err() == nil // noteBacklogLocked closed it
		endStream()
		s.mu.Lock()
		s.streamUp, s.endStream = false, nil
		s.window, s.cut = nil, cut{}
		if s.mode == streaming {
			s.setModeLocked(leaving, "the replication stream broke")
		}
		s.mu.Unlock()
		switch {
		case ctx.Err() != nil:
			return
		case closedForBacklog:
			// Dropped, the slot keeps no WAL while the polls drain; the stream opens again
			// on a new slot.
			s.awaitSlotInactive(ctx)
			if err := s.dropSlot(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("outbox relay: dropping the slot while polling a backlog failed", "slot", s.cfg.Slot, "err", err)
			}
			continue
		}
		s.log.Warn("outbox relay: the replication stream broke; polling until it is back", "slot", s.cfg.Slot, "err", err)
		sleep(leadCtx, s.cfg.StandbyRetry)
	}
}

func (s *Store) streamPaused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// stream creates the slot if it is missing, starts replication and reads it until ctx
// ends or the connection fails.
func (s *Store) stream(ctx context.Context) error {
	var rel uint32
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1)::oid", s.names.Outbox).Scan(&rel); err != nil {
		return fmt.Errorf("finding the outbox table: %w", err)
	}
	if err := s.ensureSlot(ctx); err != nil {
		return err
	}
	cc := s.pool.Config().ConnConfig.Config.Copy()
	cc.RuntimeParams["replication"] = "database"
	cc.RuntimeParams["bytea_output"] = "hex"
	cc.RuntimeParams["TimeZone"] = "UTC"
	cc.RuntimeParams["DateStyle"] = "ISO"
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.cfg.Publication + "'"},
	})
	if err != nil {
		return fmt.Errorf("starting replication from slot %s: %w", s.cfg.Slot, err)
	}
	s.mu.Lock()
	s.streamUp = true
	s.mu.Unlock()

	d := decoder{rel: rel}
	inTx, xid := false, uint32(0)
	var txRows []row
	nextStatus := time.Now().Add(statusInterval)
	for {
		syncing := s.syncs.Load() > 0 // Sync waits: ask the server where it is, often
		if now := time.Now(); now.After(nextStatus) || syncing {
			if err := s.confirm(ctx, conn, syncing); err != nil {
				return err
			}
			nextStatus = now.Add(statusInterval)
		}
		deadline := nextStatus
		if syncing {
			deadline = time.Now().Add(5 * time.Millisecond)
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case err != nil && pgconn.Timeout(err) && ctx.Err() == nil:
			continue
		case err != nil:
			return err
		}
		var data []byte
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return err
			}
			if !inTx {
				s.advance(uint64(k.ServerWALEnd))
			}
			if k.ReplyRequested {
				nextStatus = time.Time{}
			}
			continue
		case pglogrepl.XLogDataByteID:
		default:
			continue
		}
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		lm, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return fmt.Errorf("decoding the log: %w", err)
		}
		switch m := lm.(type) {
		case *pglogrepl.RelationMessage:
			d.relation(m)
		case *pglogrepl.BeginMessage:
			inTx, xid, txRows = true, m.Xid, txRows[:0]
		case *pglogrepl.InsertMessage:
			if m.RelationID == d.rel {
				txRows = append(txRows, row{xid: xid, claimed: d.claimed(m.Tuple)})
			}
		case *pglogrepl.CommitMessage:
			inTx = false
			s.commit(uint64(m.TransactionEndLSN), txRows)
			clear(txRows)
		}
	}
}

// commit hands a transaction's outbox rows to the store and advances the position past it.
func (s *Store) commit(lsn uint64, rows []row) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rows {
		s.arrivals++
		r.n, r.lsn = s.arrivals, lsn
		s.admitLocked(r)
	}
	s.advanceLocked(lsn)
	if len(rows) > 0 && s.mode == streaming {
		s.wakeLocked()
	}
}

func (s *Store) advance(lsn uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(lsn)
}

func (s *Store) advanceLocked(lsn uint64) {
	if lsn > s.received {
		s.received = lsn
	}
	if s.cut.seqs != nil && s.received > s.cut.lsn {
		s.cut = cut{}
	}
}

// confirm tells the server the position read: every event before it is in the table until
// delivered, so the slot may let go of its WAL (see the package documentation).
// With reply, the server answers with its position at once (for Sync).
func (s *Store) confirm(ctx context.Context, conn *pgconn.PgConn, reply bool) error {
	s.mu.Lock()
	pos := pglogrepl.LSN(s.received)
	s.mu.Unlock()
	if pos == 0 && !reply {
		return nil
	}
	return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos, ReplyRequested: reply})
}

// dropSlot drops the slot (the table holds every event its WAL brings).
func (s *Store) dropSlot(ctx context.Context) error {
	return sqlstore.DropSlot(ctx, pgxdb.Querier{Q: s.pool}, s.cfg.Slot)
}

// ensureSlot creates the slot if it does not exist (the first start, or after it was
// dropped or invalidated and dropped by an operator). A slot that lost its WAL, or that is
// further behind the server than MaxSlotLag, is dropped and created again at the server's
// position: the table holds every event of the WAL skipped, and the store polls it.
func (s *Store) ensureSlot(ctx context.Context) error {
	q := pgxdb.Querier{Q: s.pool}
	st, err := sqlstore.ReadSlot(ctx, q, s.cfg.Slot)
	if err != nil {
		return err
	}
	if st.Exists {
		var level slog.Level
		var why string
		switch {
		case st.WALStatus == "lost": // max_slot_wal_keep_size was reached: the guard worked, but look why
			level, why = slog.LevelError, "the replication slot lost its WAL (max_slot_wal_keep_size)"
		case s.cfg.MaxSlotLag > 0 && st.Lag > s.cfg.MaxSlotLag: // a relay stopped, or a backlog polled
			level, why = slog.LevelInfo, fmt.Sprintf("the replication slot is %d MiB of WAL behind the server (MaxSlotLag %d MiB): reading the table is cheaper than decoding that WAL",
				st.Lag>>20, s.cfg.MaxSlotLag>>20)
		default:
			return nil
		}
		s.log.Log(ctx, level, "outbox relay: "+why+"; dropping the slot and creating it again, the table holds every undelivered event", "slot", s.cfg.Slot)
		if err := s.dropSlot(ctx); err != nil {
			return err
		}
	}
	created, err := sqlstore.CreateSlot(ctx, q, s.cfg.Slot)
	if created {
		s.log.Info("outbox relay: created the replication slot", "slot", s.cfg.Slot)
	}
	return err
}

// decoder turns the log's inserts into the outbox into claimed rows.
type decoder struct {
	rel  uint32
	cols map[string]int // column name → position in a tuple
}

func (d *decoder) relation(m *pglogrepl.RelationMessage) {
	if m.RelationID != d.rel {
		return
	}
	d.cols = make(map[string]int, len(m.Columns))
	for i, c := range m.Columns {
		d.cols[c.Name] = i
	}
}

// claimed parses a tuple as a claim parses a row: a value that cannot be read does not
// fail the stream, it comes back in Claimed.Err for the relay to dead-letter the row alone.
func (d *decoder) claimed(t *pglogrepl.TupleData) outboxdriver.Claimed {
	text := func(name string) (string, bool) {
		i, ok := d.cols[name]
		if !ok || t == nil || i >= len(t.Columns) || t.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return "", false
		}
		return string(t.Columns[i].Data), true
	}
	var problems []string
	seqText, _ := text("seq")
	seq, err := strconv.ParseInt(seqText, 10, 64)
	if err != nil {
		problems = append(problems, fmt.Sprintf("column seq: %q is not a number", seqText))
	}
	r := sqlstore.TextRow{Seq: seq}
	r.ID, _ = text("id")
	r.Type, _ = text("type")
	r.Key, _ = text("key")
	r.Headers, _ = text("headers")
	r.ContentType, _ = text("content_type")
	r.CreatedAt, _ = text("created_at")
	body, _ := text("body")
	if b, ok := strings.CutPrefix(body, `\x`); ok {
		if r.Body, err = hex.DecodeString(b); err != nil {
			problems = append(problems, "column body: not bytea in hex")
		}
	} else {
		problems = append(problems, "column body: not bytea in hex")
	}
	c := outboxdriver.Claimed{Seq: seq, Attempts: 1}
	c.Message, c.Err = r.Message()
	if len(problems) > 0 {
		c.Err = errors.Join(append([]error{errors.New(strings.Join(problems, "; "))}, c.Err)...)
	}
	return c
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// lsnScanner scans an LSN's text ("16/B374D848").
type lsnScanner struct{ p *uint64 }

func (l lsnScanner) Scan(src any) error {
	s, ok := src.(string)
	if !ok {
		return fmt.Errorf("an LSN as %T", src)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	*l.p = uint64(lsn)
	return err
}
