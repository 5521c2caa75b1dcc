package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
)

// TestPrune: inbox keys older than the retention go, younger ones stay; dead letters
// replayed or discarded longer ago than theirs go, recent and pending ones stay; one batch
// at a time until a batch comes back short.
func TestPrune(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		ctx := context.Background()
		tb.migrate(t)
		want(t, tb, exitUsage, "prune")
		want(t, tb, exitUsage, "prune", "--inbox-retention", "a week")

		inbox, err := tb.outbox.NewInbox(tb.DB)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := inbox.InTx(ctx, func(tx *sql.Tx) error {
				_, err := inbox.Record(ctx, tx, idempotency.Key{Consumer: "billing", EventID: uuid.New()})
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		dead := tb.deadLetters(t)
		for i := range 4 {
			m, _ := outbox.New(Placed{Order: i}).Encode()
			if err := dead.Add(ctx, deadletter.Entry{Message: m, Stage: deadletter.StageRelay, Reason: "down", Attempts: 1}); err != nil {
				t.Fatal(err)
			}
		}
		es, err := dead.List(ctx, deadletter.Filter{})
		if err != nil || len(es) != 4 {
			t.Fatal(es, err)
		}
		_ = dead.Replay(ctx, es[0].ID)
		_ = dead.Discard(ctx, es[1].ID)
		_ = dead.Discard(ctx, es[2].ID) // recent: stays
		// es[3] stays pending, and its time is made old too: pending is never pruned.
		tenDaysAgo := map[string]string{
			"postgres": "now() - interval '10 days'",
			"mysql":    "UTC_TIMESTAMP(6) - INTERVAL 10 DAY",
			"sqlite":   "strftime('%Y-%m-%d %H:%M:%f', 'now', '-10 days')",
		}[tb.Dialect]
		exec := func(q string) {
			if _, err := tb.DB.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		exec("UPDATE " + tb.table("_inbox") + " SET processed_at = " + tenDaysAgo + " WHERE event_id IN (SELECT event_id FROM (SELECT event_id FROM " +
			tb.table("_inbox") + " ORDER BY event_id LIMIT 2) AS two)")
		exec("UPDATE " + tb.table("_dead_letters") + " SET status_changed_at = " + tenDaysAgo + ", last_failed_at = " + tenDaysAgo +
			" WHERE id IN (" + join(es[0].ID, es[1].ID, es[3].ID) + ")")

		r := ok(t, tb, "prune", "--inbox-retention", "7d", "--dead-letters-retention", "168h", "--batch", "1", "--json")
		var got pruneReport
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.InboxKeys != 2 || got.DeadLetters != 2 {
			t.Fatalf("prune: %s (%v); want 2 inbox keys and 2 dead letters", r.stdout, err)
		}
		if left := tb.scalar(t, "SELECT count(*) FROM "+tb.table("_inbox")); left != 1 {
			t.Errorf("%d inbox keys left, want the recent one", left)
		}
		left, err := dead.List(ctx, deadletter.Filter{})
		if err != nil || len(left) != 2 || left[0].ID != es[2].ID || left[1].ID != es[3].ID {
			t.Errorf("dead letters left: %+v, %v; want the recent discard and the pending one", left, err)
		}
		r = ok(t, tb, "prune", "--dead-letters-retention", "1d")
		if !strings.Contains(r.stdout, "deleted 0 dead letters") {
			t.Errorf("second prune: %s", r.stdout)
		}
	})
}

func join(ids ...int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}
