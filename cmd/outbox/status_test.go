package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Placed is the event the tests publish.
type Placed struct {
	Order int    `json:"order"`
	Note  string `json:"note,omitempty"`
}

func (Placed) EventType() string { return "orders.placed" }

// TestStatus: the numbers "outbox status" reports are those of the tables: backlog and its
// oldest event, events waiting for a retry, live leases by owner, dead letters by status,
// stage, kind and type, inbox keys by consumer.
func TestStatus(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		ctx := context.Background()
		tb.migrate(t)
		r := ok(t, tb, "status")
		for _, line := range []string{"backlog       0 events", "leases        none", "dead letters  0 pending", "inbox         empty"} {
			if !strings.Contains(r.stdout, line) {
				t.Fatalf("status of an empty outbox lacks %q:\n%s", line, r.stdout)
			}
		}

		first := outbox.New(Placed{Order: 1})
		events := []outbox.Encodable{first}
		for i := 2; i <= 6; i++ {
			events = append(events, outbox.New(Placed{Order: i}))
		}
		tb.publish(t, events...)
		store, err := tb.outbox.NewStore(tb.DB)
		if err != nil {
			t.Fatal(err)
		}
		claim := func(owner string, token int64, n int) []outboxdriver.Claimed {
			c, err := store.Claim(ctx, outboxdriver.ClaimParams{Owner: owner, Token: token, Limit: n, Lease: time.Minute})
			if err != nil || len(c) != n {
				t.Fatalf("claim by %s: %d, %v", owner, len(c), err)
			}
			return c
		}
		claim("relay-a", 1, 2)
		claim("relay-b", 2, 1)
		retried := claim("relay-c", 3, 1)
		if err := store.Retry(ctx, 3, []outboxdriver.Retry{{Seq: retried[0].Seq, Delay: time.Hour, Error: "broker down"}}); err != nil {
			t.Fatal(err)
		}

		dead := tb.deadLetters(t)
		add := func(e deadletter.Entry) {
			t.Helper()
			if err := dead.Add(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		msg := func(p Placed) outbox.Message {
			m, err := outbox.New(p).Encode()
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		add(deadletter.Entry{Message: msg(Placed{Order: 7}), Stage: deadletter.StageConsumer, Kind: deadletter.KindGaveUp, Consumer: "billing", Reason: "timeout", Attempts: 5})
		add(deadletter.Entry{Message: msg(Placed{Order: 8}), Stage: deadletter.StageConsumer, Kind: deadletter.KindGaveUp, Consumer: "billing", Reason: "timeout", Attempts: 5})
		add(deadletter.Entry{Message: msg(Placed{Order: 9}), Stage: deadletter.StageRelay, Kind: deadletter.KindTooLarge, Reason: "too large", Attempts: 1})
		add(deadletter.Entry{Message: msg(Placed{Order: 10}), Stage: deadletter.StageRelay, Kind: deadletter.KindPermanent, Reason: "refused", Attempts: 1})
		all, err := dead.List(ctx, deadletter.Filter{Kind: deadletter.KindPermanent})
		if err != nil || len(all) != 1 {
			t.Fatal(all, err)
		}
		if err := dead.Discard(ctx, all[0].ID); err != nil {
			t.Fatal(err)
		}

		inbox, err := tb.outbox.NewInbox(tb.DB)
		if err != nil {
			t.Fatal(err)
		}
		for consumer, n := range map[string]int{"billing": 3, "mailer": 1} {
			for range n {
				err := inbox.InTx(ctx, func(tx *sql.Tx) error {
					_, err := inbox.Record(ctx, tx, idempotency.Key{Consumer: consumer, EventID: uuid.New()})
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			}
		}

		r = ok(t, tb, "status", "--json")
		var got report
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("%v\n%s", err, r.stdout)
		}
		// What the tables hold, read with plain SQL.
		if want := tb.scalar(t, "SELECT count(*) FROM "+tb.table("")); got.Backlog.Events != want || want != 6 {
			t.Errorf("backlog %d, the table has %d rows (6 published)", got.Backlog.Events, want)
		}
		if got.Backlog.OldestCreatedAt == nil || got.Backlog.OldestCreatedAt.Sub(first.CreatedAt).Abs() > time.Millisecond {
			t.Errorf("oldest undelivered created at %v, the first event at %v", got.Backlog.OldestCreatedAt, first.CreatedAt)
		}
		if got.Backlog.OldestAgeSeconds == nil || *got.Backlog.OldestAgeSeconds < 0 || *got.Backlog.OldestAgeSeconds > 600 {
			t.Errorf("oldest age %v seconds", got.Backlog.OldestAgeSeconds)
		}
		if want := tb.scalar(t, "SELECT count(*) FROM "+tb.table("")+" WHERE last_error IS NOT NULL"); got.Backlog.Retrying != want || want != 1 {
			t.Errorf("retrying %d, the table has %d rows with an error (1 retried)", got.Backlog.Retrying, want)
		}
		leases := map[string]int64{}
		for _, l := range got.Leases {
			leases[l.Owner] = l.Rows
			if l.ExpiresAt.Before(got.Now) {
				t.Errorf("lease of %s expired at %v, before now %v", l.Owner, l.ExpiresAt, got.Now)
			}
		}
		for owner, n := range map[string]int64{"relay-a": 2, "relay-b": 1} {
			if leases[owner] != n || tb.scalar(t, "SELECT count(*) FROM "+tb.table("")+" WHERE lease_owner = ?", owner) != n {
				t.Errorf("leases of %s: %d reported, want %d as in the table", owner, leases[owner], n)
			}
		}
		if len(leases) != 2 {
			t.Errorf("leases %v: relay-c's row was released for a retry", leases)
		}
		dl := got.DeadLetters
		pending := tb.scalar(t, "SELECT count(*) FROM "+tb.table("_dead_letters")+" WHERE status = 'pending'")
		if dl.Pending != pending || pending != 3 || dl.Discarded != 1 || dl.Replayed != 0 {
			t.Errorf("dead letters %d pending (table: %d), %d discarded, %d replayed; want 3, 1, 0", dl.Pending, pending, dl.Discarded, dl.Replayed)
		}
		groups := map[string]int64{}
		for _, g := range dl.Groups {
			groups[g.Status+"/"+g.Stage+"/"+g.Kind+"/"+g.EventType+"/"+g.Consumer] = g.Count
		}
		wantGroups := map[string]int64{
			"pending/consumer/gave-up/orders.placed/billing": 2,
			"pending/relay/too-large/orders.placed/":         1,
			"discarded/relay/permanent/orders.placed/":       1,
		}
		if len(groups) != len(wantGroups) {
			t.Errorf("dead-letter groups %v, want %v", groups, wantGroups)
		}
		for k, n := range wantGroups {
			if groups[k] != n {
				t.Errorf("dead-letter group %s: %d, want %d", k, groups[k], n)
			}
		}
		inboxes := map[string]int64{}
		for _, c := range got.Inbox {
			inboxes[c.Consumer] = c.Keys
		}
		for consumer, n := range map[string]int64{"billing": 3, "mailer": 1} {
			if inboxes[consumer] != n || tb.scalar(t, "SELECT count(*) FROM "+tb.table("_inbox")+" WHERE consumer = ?", consumer) != n {
				t.Errorf("inbox of %s: %d, want %d", consumer, inboxes[consumer], n)
			}
		}

		r = ok(t, tb, "status")
		for _, want := range []string{"backlog       6 events, the oldest created", "retrying      1 events", "relay-a", "relay-b",
			"dead letters  3 pending", "1 discarded", "gave-up", "too-large", "billing", "mailer"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("status lacks %q:\n%s", want, r.stdout)
			}
		}
	})
}

// TestStatusShowsHeldKeys: a keyed event dead-lettered under KeyPolicy HoldKey holds its
// key; "outbox status" (text and JSON) and the console's status page show the key and the
// dead letter to replay or discard, until it is discarded.
func TestStatusShowsHeldKeys(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		ctx := context.Background()
		tb.migrate(t)
		r := ok(t, tb, "status")
		if !strings.Contains(r.stdout, "held keys     none") {
			t.Fatalf("status of an empty outbox lacks the held keys line:\n%s", r.stdout)
		}
		tb.publish(t, outbox.New(Placed{Order: 1}, outbox.WithKey("acct-1")), outbox.New(Placed{Order: 2}, outbox.WithKey("acct-1")))
		store, err := tb.outbox.NewStore(tb.DB)
		if err != nil {
			t.Fatal(err)
		}
		c, err := store.Claim(ctx, outboxdriver.ClaimParams{Owner: "relay", Token: 1, Limit: 1, Lease: time.Minute})
		if err != nil || len(c) != 1 {
			t.Fatalf("claim: %d, %v", len(c), err)
		}
		if _, err := store.DeadLetter(ctx, 1, []outboxdriver.DeadLetter{{Seq: c[0].Seq, Kind: "permanent", Reason: "refused", HoldKey: true}}); err != nil {
			t.Fatal(err)
		}
		dl, err := tb.deadLetters(t).List(ctx, deadletter.Filter{})
		if err != nil || len(dl) != 1 || dl[0].HeldSeq != c[0].Seq {
			t.Fatalf("dead letters %+v (%v), want one holding row %d", dl, err, c[0].Seq)
		}

		r = ok(t, tb, "status", "--json")
		var got report
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("%v\n%s", err, r.stdout)
		}
		if h := got.HeldKeys; h.Count != 1 || len(h.First) != 1 || h.First[0].Key != "acct-1" || h.First[0].DeadLetterID != dl[0].ID {
			t.Errorf("held keys %+v, want acct-1 held by dead letter %d", h, dl[0].ID)
		}
		r = ok(t, tb, "status")
		for _, want := range []string{"held keys     1 key held by a pending dead letter", "acct-1", fmt.Sprint(dl[0].ID)} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("status lacks %q:\n%s", want, r.stdout)
			}
		}
		if tb.Dialect == "sqlite" {
			base := startConsole(t, tb, nil)
			code, body := getPage(t, base+"/")
			if code != 200 || !strings.Contains(body, `id="held-keys"`) || !strings.Contains(body, "acct-1") ||
				!strings.Contains(body, fmt.Sprintf(`href="/dead-letters/%d"`, dl[0].ID)) {
				t.Errorf("the console's status page (%d) does not show the held key and its dead letter:\n%s", code, body)
			}
		}

		if err := tb.deadLetters(t).Discard(ctx, dl[0].ID); err != nil {
			t.Fatal(err)
		}
		r = ok(t, tb, "status", "--json")
		got = report{}
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatal(err)
		}
		if got.HeldKeys.Count != 0 || got.Backlog.Events != 1 {
			t.Errorf("after the discard: %d held keys, %d events in the backlog; want 0 and 1 (the key's next event)", got.HeldKeys.Count, got.Backlog.Events)
		}
	})
}

func TestStatusShowsScheduled(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		tb.migrate(t)
		r := ok(t, tb, "status")
		if !strings.Contains(r.stdout, "scheduled     0 events") {
			t.Fatalf("status of an empty outbox lacks the scheduled line:\n%s", r.stdout)
		}
		due := time.Now().Add(3 * time.Hour)
		tb.publish(t, outbox.New(Placed{Order: 1}, outbox.WithDeliverAt(due)), outbox.New(Placed{Order: 2}, outbox.WithDeliverAt(due.Add(time.Hour))),
			outbox.New(Placed{Order: 3}))

		r = ok(t, tb, "status", "--json")
		var got report
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("%v\n%s", err, r.stdout)
		}
		if s := got.Scheduled; s.Events != 2 || s.NextDueAt == nil || s.NextDueAt.Sub(due).Abs() > time.Second || got.Backlog.Events != 1 {
			t.Errorf("scheduled %+v, backlog %d; want 2 events due at %v, 1 in the backlog", s, got.Backlog.Events, due)
		}
		r = ok(t, tb, "status")
		if !strings.Contains(r.stdout, "scheduled     2 events, the next due in 2h59m") && !strings.Contains(r.stdout, "scheduled     2 events, the next due in 3h00m") {
			t.Errorf("status lacks the scheduled events:\n%s", r.stdout)
		}
		if tb.Dialect == "sqlite" {
			base := startConsole(t, tb, nil)
			if code, body := getPage(t, base+"/"); code != 200 || !strings.Contains(body, `id="scheduled">2<`) {
				t.Errorf("the console's status page (%d) does not show 2 scheduled events:\n%s", code, body)
			}
		}
	})
}
