package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestLogRelay: on a PostgreSQL with wal_level = logical, "migrate --log" creates the
// publication, "relay --log" (a subprocess) creates its slot and delivers what is
// published, "status" shows the slot read and then unread once the relay stopped, its
// WAL is a metric, and "log drop" drops the slot and the publication.
func TestLogRelay(t *testing.T) {
	outboxtest.SkipIfShort(t, "starts a PostgreSQL server")
	srv := pgxtest.StartServer(t, pgxtest.LogicalSettings...)
	ctx := context.Background()
	schema := randomName("cli")
	tb := &testDB{url: srv.URL(), flags: []string{"--database-url", srv.URL(), "--schema", schema}}
	slot := "txoutbox_" + schema + "_outbox"

	r := ok(t, tb, "migrate", "--log")
	if !strings.Contains(r.stdout, "publication "+slot) {
		t.Fatalf("migrate --log: %s", r.stdout)
	}
	ok(t, tb, "migrate", "--log") // again: nothing to do, the publication exists
	if r := ok(t, tb, "status"); strings.Contains(r.stdout, "log slot") {
		t.Fatalf("a slot before any relay read the log:\n%s", r.stdout)
	}

	b := natsBroker(t)
	args := append([]string{"relay"}, tb.flags...)
	args = append(args, "--log", "--transport", b.url, "--listen", "127.0.0.1:0")
	for _, r := range b.routes {
		args = append(args, "--route", r)
	}
	d := startDaemon(t, b.env, args...)
	addr := d.addr(t)

	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	o, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	published := map[uuid.UUID]bool{}
	for i := range 5 {
		e := outbox.New(Placed{Order: i}, outbox.WithKey("order"))
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Publish(ctx, tx, e) }); err != nil {
			t.Fatal(err)
		}
		published[e.ID] = true
	}
	rctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	for got := 0; got < len(published); {
		msgs, err := b.collect(rctx)
		if err != nil {
			t.Fatalf("receiving (got %d of %d): %v\nrelay log:\n%s", got, len(published), err, d.stderr())
		}
		for _, m := range msgs {
			if !published[m.ID] {
				t.Fatalf("received %s, not one published", m.ID)
			}
			got++
		}
	}
	if !strings.Contains(d.stderr(), "mode=log") {
		t.Errorf("the relay's log does not say it reads the log:\n%s", d.stderr())
	}

	outboxtest.WaitFor(t, deadline, "status to show the slot read", func() bool {
		return strings.Contains(ok(t, tb, "status").stdout, "log slot      "+slot+", read by a relay")
	})
	var rep struct {
		Slot *slotJSON `json:"slot"`
	}
	if err := json.Unmarshal([]byte(ok(t, tb, "status", "--json").stdout), &rep); err != nil || rep.Slot == nil || !rep.Slot.Active {
		t.Fatalf("status --json: slot %+v, %v", rep.Slot, err)
	}
	outboxtest.WaitFor(t, deadline, "the slot's gauges on /metrics", func() bool {
		_, metrics := get(t, "http://"+addr+"/metrics")
		return strings.Contains(metrics, "txoutbox_relay_slot_retained_wal_bytes{")
	})
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.stderr())
	}
	outboxtest.WaitFor(t, deadline, "status to show the slot unread", func() bool {
		return strings.Contains(ok(t, tb, "status").stdout, "read by NO relay")
	})

	r = ok(t, tb, "log", "drop")
	if !strings.Contains(r.stdout, "dropped slot "+slot) {
		t.Fatalf("log drop: %s", r.stdout)
	}
	if r := ok(t, tb, "status"); strings.Contains(r.stdout, "log slot") {
		t.Fatalf("the slot survived log drop:\n%s", r.stdout)
	}
	want(t, tb, exitUsage, "log", "drop", "--slot", "Bad-Name")
}
