package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// TestDeadLetterHistory: the status chart's numbers — dead letters by kind and by hour of
// their last failure — are those of the table, on every database, and the chart stacks
// them in the right slots.
func TestDeadLetterHistory(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		ctx := context.Background()
		tb.migrate(t)
		dead := tb.deadLetters(t)
		now := time.Now().UTC()
		hour := now.Truncate(time.Hour)
		// kind, hours ago (from the start of this hour, plus 10 minutes)
		seeds := []struct {
			kind deadletter.Kind
			ago  int
		}{
			{deadletter.KindGaveUp, 0}, {deadletter.KindGaveUp, 0}, {deadletter.KindPermanent, 0},
			{deadletter.KindGaveUp, 3}, {deadletter.KindMalformed, 3},
			{deadletter.KindTooLarge, 30}, // outside 24h
		}
		for i, s := range seeds {
			m, _ := outbox.New(Placed{Order: i}).Encode()
			if err := dead.Add(ctx, deadletter.Entry{Message: m, Stage: deadletter.StageConsumer, Kind: s.kind, Reason: "x", Attempts: 1}); err != nil {
				t.Fatal(err)
			}
			at := hour.Add(-time.Duration(s.ago)*time.Hour + 10*time.Minute)
			if at.After(now) {
				at = now
			}
			var bind any = at
			if tb.Dialect == "sqlite" {
				bind = at.Format("2006-01-02 15:04:05.000")
			}
			q := "UPDATE " + tb.table("_dead_letters") + " SET last_failed_at = ? WHERE id = ?"
			if tb.Dialect == "postgres" {
				q = "UPDATE " + tb.table("_dead_letters") + " SET last_failed_at = $1 WHERE id = $2"
			}
			if _, err := tb.DB.ExecContext(ctx, q, bind, i+1); err != nil {
				t.Fatal(err)
			}
		}
		d, err := sqlstore.Lookup(tb.Dialect)
		if err != nil {
			t.Fatal(err)
		}
		names, err := (&dbFlags{schema: tb.Tables.Schema, table: tb.Tables.Outbox}).names(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sqlstore.DeadLetterHistory(ctx, d, sqlstore.StdDB(tb.DB), names, now.Add(-24*time.Hour), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]int64{}
		for _, b := range got {
			counts[fmt.Sprintf("%s@%s", b.Kind, b.Start.Format("15:04"))] = b.Count
		}
		want := map[string]int64{
			"gave-up@" + hour.Format("15:04"):                     2,
			"permanent@" + hour.Format("15:04"):                   1,
			"gave-up@" + hour.Add(-3*time.Hour).Format("15:04"):   1,
			"malformed@" + hour.Add(-3*time.Hour).Format("15:04"): 1,
		}
		if fmt.Sprint(counts) != fmt.Sprint(want) {
			t.Fatalf("history %v, want %v", counts, want)
		}

		s := &store{target: target{dialect: d}, names: names, q: sqlstore.StdDB(tb.DB)}
		ch, err := (&console{s: s}).history(ctx, "24h", now)
		if err != nil {
			t.Fatal(err)
		}
		if len(ch.Bars) != 4 || ch.Max != 3 || len(ch.Legend) != 3 {
			t.Fatalf("chart: %d bars, max %d, legend %v; want 4 bars, a max of 3 and 3 kinds", len(ch.Bars), ch.Max, ch.Legend)
		}
		last := ch.Bars[0]
		for _, b := range ch.Bars {
			if b.X > last.X {
				last = b
			}
		}
		if slotRight := float64(ch.Right); last.X+last.W > slotRight || last.X < slotRight-2*(slotRight-float64(ch.Left))/24 {
			t.Fatalf("this hour's bar at x=%v, not in the last slot before %v", last.X, slotRight)
		}
	})
}
