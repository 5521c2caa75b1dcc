package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
)

// report is the status of one outbox, as "outbox status" prints it and the console shows it.
type report struct {
	Outbox   string    `json:"outbox"`
	Database string    `json:"database"`
	Now      time.Time `json:"now"`
	Schema   struct {
		Current  bool   `json:"current"`
		Applied  []int  `json:"applied"`
		Pending  []int  `json:"pending"`
		Unknown  []int  `json:"unknown"`
		Problems string `json:"problems,omitempty"`
	} `json:"schema"`
	Backlog struct {
		Events int64 `json:"events"`
		// OldestCreatedAt and OldestAgeSeconds are absent when the backlog is empty.
		OldestCreatedAt  *time.Time `json:"oldest_created_at,omitempty"`
		OldestAgeSeconds *float64   `json:"oldest_age_seconds,omitempty"`
		Retrying         int64      `json:"retrying"`
	} `json:"backlog"`
	// Scheduled counts the events due later (outbox.WithDeliverAt), not yet in the backlog;
	// NextDueAt is absent when there is none.
	Scheduled struct {
		Events    int64      `json:"events"`
		NextDueAt *time.Time `json:"next_due_at,omitempty"`
	} `json:"scheduled"`
	Leases      []leaseJSON `json:"leases"`
	DeadLetters struct {
		Pending   int64 `json:"pending"`
		Replayed  int64 `json:"replayed"`
		Discarded int64 `json:"discarded"`
		// OldestPendingFailedAt is when the oldest pending dead letter last failed.
		OldestPendingFailedAt *time.Time  `json:"oldest_pending_failed_at,omitempty"`
		Groups                []groupJSON `json:"groups"`
	} `json:"dead_letters"`
	// HeldKeys are the keys whose later events wait behind a pending dead letter of the
	// relay: Count of them, and the first (oldest hold first).
	HeldKeys struct {
		Count int64      `json:"count"`
		First []heldJSON `json:"first"`
	} `json:"held_keys"`
	Inbox []inboxJSON `json:"inbox"`
	// Slot is the replication slot of the relay that reads the log (outbox relay --log),
	// on PostgreSQL when it exists.
	Slot *slotJSON `json:"slot,omitempty"`
}

type slotJSON struct {
	Name             string `json:"name"`
	Active           bool   `json:"active"`
	RetainedWALBytes int64  `json:"retained_wal_bytes"`
	LagBytes         int64  `json:"lag_bytes"`
	WALStatus        string `json:"wal_status"`
}

// heldJSON is a held key and the dead letter that holds it.
type heldJSON struct {
	Key          string    `json:"key"`
	DeadLetterID int64     `json:"dead_letter_id"`
	Since        time.Time `json:"since"`
}

// shownHeldKeys is how many held keys the status lists.
const shownHeldKeys = 10

type leaseJSON struct {
	Owner     string    `json:"owner"`
	Rows      int64     `json:"rows"`
	ExpiresAt time.Time `json:"expires_at"`
}

type groupJSON struct {
	Status       string    `json:"status"`
	Stage        string    `json:"stage"`
	Kind         string    `json:"kind"`
	EventType    string    `json:"event_type"`
	Consumer     string    `json:"consumer"`
	Count        int64     `json:"count"`
	LastFailedAt time.Time `json:"last_failed_at"`
}

type inboxJSON struct {
	Consumer string `json:"consumer"`
	Keys     int64  `json:"keys"`
}

// readReport reads everything the status shows. The backlog and the pending dead letters
// come from the store's Stats, the statement the relay's gauges sample.
func (s *store) readReport(ctx context.Context) (*report, error) {
	r := &report{Outbox: s.names.Outbox, Database: s.shown}
	st, err := sqlstore.Migrations(ctx, s.dialect, s.q, s.names)
	if err != nil {
		return nil, err
	}
	r.Schema.Applied, r.Schema.Pending, r.Schema.Unknown = orEmpty(st.Applied), versions(st.Pending), orEmpty(st.Unknown)
	if verr := s.checkSchema(ctx); verr != nil {
		if !errors.Is(verr, sqlstore.ErrSchema) {
			return nil, verr
		}
		r.Schema.Problems = verr.Error()
		return r, verr // nothing else can be read reliably
	}
	r.Schema.Current = true

	relayStore, err := s.outbox.NewStore(s.db)
	if err != nil {
		return nil, err
	}
	stats, err := relayStore.(outboxdriver.StatsReader).Stats(ctx)
	if err != nil {
		return nil, err
	}
	leases, now, err := sqlstore.Leases(ctx, s.dialect, s.q, s.names)
	if err != nil {
		return nil, err
	}
	r.Now = now
	r.Backlog.Events = stats.Backlog
	if !stats.OldestUndelivered.IsZero() {
		t := stats.OldestUndelivered.UTC()
		secs := now.Sub(t).Seconds()
		r.Backlog.OldestCreatedAt, r.Backlog.OldestAgeSeconds = &t, &secs
	}
	r.Scheduled.Events = stats.Scheduled
	if !stats.NextDue.IsZero() {
		t := stats.NextDue.UTC()
		r.Scheduled.NextDueAt = &t
	}
	if r.Backlog.Retrying, err = sqlstore.Retrying(ctx, s.dialect, s.q, s.names); err != nil {
		return nil, err
	}
	r.Leases = []leaseJSON{}
	for _, l := range leases {
		r.Leases = append(r.Leases, leaseJSON{Owner: l.Owner, Rows: l.Rows, ExpiresAt: l.Until})
	}
	r.DeadLetters.Pending = stats.DeadLettersPending
	if !stats.OldestPendingDeadLetter.IsZero() {
		t := stats.OldestPendingDeadLetter.UTC()
		r.DeadLetters.OldestPendingFailedAt = &t
	}
	r.HeldKeys.Count, r.HeldKeys.First = stats.HeldKeys, []heldJSON{}
	if stats.HeldKeys > 0 {
		held, err := sqlstore.HeldKeys(ctx, s.dialect, s.q, s.names, shownHeldKeys)
		if err != nil {
			return nil, err
		}
		for _, h := range held {
			r.HeldKeys.First = append(r.HeldKeys.First, heldJSON{Key: h.Key, DeadLetterID: h.DeadLetterID, Since: h.Since})
		}
	}
	groups, err := sqlstore.DeadLetterGroups(ctx, s.dialect, s.q, s.names)
	if err != nil {
		return nil, err
	}
	r.DeadLetters.Groups = []groupJSON{}
	for _, g := range groups {
		switch g.Status {
		case "replayed":
			r.DeadLetters.Replayed += g.Count
		case "discarded":
			r.DeadLetters.Discarded += g.Count
		}
		r.DeadLetters.Groups = append(r.DeadLetters.Groups, groupJSON{Status: g.Status, Stage: g.Stage, Kind: g.Kind,
			EventType: g.EventType, Consumer: g.Consumer, Count: g.Count, LastFailedAt: g.LastFailedAt})
	}
	inbox, err := s.outbox.NewInbox(s.db)
	if err != nil {
		return nil, err
	}
	counts, err := inbox.Counts(ctx)
	if err != nil {
		return nil, err
	}
	r.Inbox = []inboxJSON{}
	for c, n := range counts {
		r.Inbox = append(r.Inbox, inboxJSON{Consumer: c, Keys: n})
	}
	slices.SortFunc(r.Inbox, func(a, b inboxJSON) int {
		if a.Consumer < b.Consumer {
			return -1
		}
		if a.Consumer > b.Consumer {
			return 1
		}
		return 0
	})
	return r, nil
}

func (a *app) status(ctx context.Context, args []string) error {
	fs := a.flags("status", "[--json] [flags]")
	var f dbFlags
	f.add(a, fs)
	asJSON := fs.Bool("json", false, "print the status as JSON")
	var lg logFlags
	lg.add(a, fs, "")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	if err := lg.check(); err != nil {
		return err
	}
	s, err := a.open(ctx, f, false)
	if err != nil {
		return err
	}
	defer s.Close()
	r, err := s.readReport(ctx)
	if r != nil && err == nil && s.dialect == sqlstore.Postgres {
		r.Slot, err = s.readSlot(ctx, lg.slotOf(s.names))
	}
	if r == nil {
		return a.stderr.hide(err)
	}
	if *asJSON {
		r.Schema.Problems = a.stderr.redact(r.Schema.Problems)
		if perr := printJSON(a.stdout, r); perr != nil {
			return perr
		}
		if err != nil {
			return errQuiet{exitSchema}
		}
		return nil
	}
	if err != nil {
		return a.stderr.hide(err)
	}
	a.printReport(r)
	return nil
}

func (a *app) printReport(r *report) {
	w := a.stdout
	fmt.Fprintf(w, "outbox        %s on %s\n", clean(r.Outbox), r.Database)
	fmt.Fprintf(w, "schema        current (migrations %s)\n", list(r.Schema.Applied))
	if r.Backlog.Events == 0 {
		fmt.Fprintf(w, "backlog       0 events\n")
	} else {
		fmt.Fprintf(w, "backlog       %s events, the oldest created %s ago (%s)\n", count(r.Backlog.Events),
			age(time.Duration(*r.Backlog.OldestAgeSeconds*float64(time.Second))), stamp(*r.Backlog.OldestCreatedAt))
	}
	fmt.Fprintf(w, "retrying      %s events failed to send and wait for another attempt\n", count(r.Backlog.Retrying))
	if r.Scheduled.NextDueAt == nil {
		fmt.Fprintf(w, "scheduled     0 events\n")
	} else {
		fmt.Fprintf(w, "scheduled     %s events, the next due in %s (%s)\n", count(r.Scheduled.Events),
			age(r.Scheduled.NextDueAt.Sub(r.Now)), stamp(*r.Scheduled.NextDueAt))
	}
	if len(r.Leases) == 0 {
		fmt.Fprintf(w, "leases        none\n")
	} else {
		fmt.Fprintf(w, "leases\n")
		t := newTable(w, "  OWNER", "ROWS", "EXPIRES IN")
		for _, l := range r.Leases {
			t.row("  "+l.Owner, count(l.Rows), age(l.ExpiresAt.Sub(r.Now)))
		}
		t.flush()
	}
	dl := r.DeadLetters
	fmt.Fprintf(w, "dead letters  %s pending", count(dl.Pending))
	if dl.OldestPendingFailedAt != nil {
		fmt.Fprintf(w, " (the oldest failed %s ago)", age(r.Now.Sub(*dl.OldestPendingFailedAt)))
	}
	fmt.Fprintf(w, ", %s replayed, %s discarded\n", count(dl.Replayed), count(dl.Discarded))
	if dl.Pending > 0 {
		t := newTable(w, "  STAGE", "KIND", "TYPE", "CONSUMER", "COUNT", "LAST FAILED")
		for _, g := range dl.Groups {
			if g.Status == "pending" {
				t.row("  "+g.Stage, orDash(g.Kind), orDash(cut(g.EventType, 40)), orDash(cut(g.Consumer, 30)), count(g.Count), stamp(g.LastFailedAt))
			}
		}
		t.flush()
	}
	a.printHeldKeys(r)
	a.printSlot(r)
	if len(r.Inbox) == 0 {
		fmt.Fprintf(w, "inbox         empty\n")
		return
	}
	fmt.Fprintf(w, "inbox\n")
	t := newTable(w, "  CONSUMER", "KEYS")
	for _, c := range r.Inbox {
		t.row("  "+cut(c.Consumer, 50), count(c.Keys))
	}
	t.flush()
}

// printHeldKeys prints the held keys, if any, and what to do about them.
func (a *app) printHeldKeys(r *report) {
	h := r.HeldKeys
	if h.Count == 0 {
		fmt.Fprintf(a.stdout, "held keys     none\n")
		return
	}
	keys := count(h.Count) + " keys"
	if h.Count == 1 {
		keys = "1 key"
	}
	fmt.Fprintf(a.stdout, "held keys     %s held by a pending dead letter: their later events wait until it is replayed (it goes first) or discarded (the key moves on)\n", keys)
	t := newTable(a.stdout, "  KEY", "DEAD LETTER", "SINCE")
	for _, k := range h.First {
		t.row("  "+clean(cut(k.Key, 60)), fmt.Sprint(k.DeadLetterID), stamp(k.Since))
	}
	t.flush()
	if rest := h.Count - int64(len(h.First)); rest > 0 {
		fmt.Fprintf(a.stdout, "  … and %s more\n", count(rest))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// readSlot reads the log relay's slot, nil when it does not exist (the outbox is polled).
func (s *store) readSlot(ctx context.Context, name string) (*slotJSON, error) {
	st, err := sqlstore.ReadSlot(ctx, s.q, name)
	if err != nil || !st.Exists {
		return nil, err
	}
	return &slotJSON{Name: st.Name, Active: st.Active, RetainedWALBytes: st.RetainedWAL, LagBytes: st.Lag, WALStatus: st.WALStatus}, nil
}

// printSlot prints the log relay's slot, if there is one, and what its state asks for.
func (a *app) printSlot(r *report) {
	sl := r.Slot
	if sl == nil {
		return
	}
	reader := "read by a relay"
	if !sl.Active {
		reader = "read by NO relay: it keeps WAL on the server's disk until one reads it, or `outbox log drop` drops it"
	}
	fmt.Fprintf(a.stdout, "log slot      %s, %s; keeps %s of WAL, confirmed %s behind", clean(sl.Name), reader, byteSize(sl.RetainedWALBytes), byteSize(sl.LagBytes))
	if sl.WALStatus == "lost" {
		fmt.Fprintf(a.stdout, "; LOST (max_slot_wal_keep_size): the relay polls and creates it again")
	}
	fmt.Fprintln(a.stdout)
}

// byteSize is n bytes for people: 512 B, 1.5 MB, 2.0 GB.
func byteSize(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), ""
	for _, s := range []string{"kB", "MB", "GB", "TB"} {
		v, suffix = v/unit, s
		if v < unit {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}
