// Command deadletters walks one failed event through the dead-letter table on PostgreSQL:
// a handler with a bug fails, is retried with backoff, gives up after MaxAttempts and lands
// in the table with the reason; someone lists it, looks at it, fixes the handler and
// replays it. A second event that no fix can save is discarded and stays for audit.
//
// It needs PostgreSQL ($TXOUTBOX_PG_URL, default the local test server); the broker is the
// in-memory transport, since the dead letters live in the database whatever the broker.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// InvoiceIssued is what the billing service publishes; the daily report adds it up.
type InvoiceIssued struct {
	InvoiceID string `json:"invoice_id"`
	Currency  string `json:"currency"`
	Amount    int64  `json:"amount"` // in the currency's minor unit
}

// EventType names the event on the wire.
func (InvoiceIssued) EventType() string { return "billing.invoice_issued" }

// operatorSQL is what an operator runs to answer "what failed in the last day, and why".
const operatorSQL = `SELECT event_key, status, attempts, reason
  FROM outbox_dead_letters
 WHERE last_failed_at > now() - interval '1 day'
 ORDER BY event_key`

type config struct{ PGURL string }

func configFromEnv() config {
	return config{PGURL: envOr("TXOUTBOX_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")}
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, configFromEnv()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, stdout io.Writer, cfg config) error {
	// A fresh schema per run, first on the search_path: the SQL below reads like your app's,
	// and runs never meet each other's rows.
	schema := fmt.Sprintf("deadletters_%08x", rand.Uint32())
	pc, err := pgxpool.ParseConfig(cfg.PGURL)
	if err != nil {
		return err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	box, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		return err
	}
	if err := box.Migrate(ctx, pool); err != nil { // creates the schema too
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (id text PRIMARY KEY, currency text NOT NULL, amount bigint NOT NULL);
		CREATE TABLE report_lines (invoice_id text PRIMARY KEY, amount_eur numeric(12, 2) NOT NULL)`); err != nil {
		return err
	}

	// The report handler. Its bug: the deployed version has no exchange rate for JPY.
	var jpyFixed atomic.Bool
	rate := func(currency string) (float64, bool) {
		switch {
		case currency == "EUR":
			return 0.01, true
		case currency == "JPY" && jpyFixed.Load():
			return 0.0062, true
		}
		return 0, false
	}
	report := func(ctx context.Context, tx pgx.Tx, e outbox.Event[InvoiceIssued]) error {
		inv := e.Payload
		if inv.Amount < 0 { // bad data, not a bug: no retry will help
			return outbox.Permanent(fmt.Errorf("invoice %s: amount %d is negative", inv.InvoiceID, inv.Amount))
		}
		r, ok := rate(inv.Currency)
		if !ok {
			return fmt.Errorf("no exchange rate for %s", inv.Currency)
		}
		_, err := tx.Exec(ctx, "INSERT INTO report_lines VALUES ($1, $2)", inv.InvoiceID, float64(inv.Amount)*r)
		return err
	}

	broker := outboxmemory.New(nil)
	store, err := box.NewStore(pool)
	if err != nil {
		return err
	}
	r, err := relay.New(store, broker, nil)
	if err != nil {
		return err
	}
	dead, err := box.NewDeadLetters(pool)
	if err != nil {
		return err
	}
	worker, err := consumer.New(broker, &consumer.Config{
		Name: "daily-report", DeadLetters: dead,
		// Three tries, ~50ms then ~100ms apart (with jitter); production waits longer.
		MaxAttempts: 3, RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: time.Second,
	})
	if err != nil {
		return err
	}
	consumer.Handle(worker, outboxpgx.Idempotent(box, pool, report, nil))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- r.Run(runCtx) }()
	go func() { done <- worker.Run(runCtx) }()
	defer func() { stop(); <-done; <-done }()

	// Billing issues three invoices: each row and its event in one transaction.
	invoices := []InvoiceIssued{{"inv-1", "EUR", 12000}, {"inv-2", "JPY", 12000}, {"inv-3", "EUR", -5000}}
	for _, inv := range invoices {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO invoices VALUES ($1, $2, $3)", inv.InvoiceID, inv.Currency, inv.Amount); err != nil {
				return err
			}
			return box.Publish(ctx, tx, outbox.New(inv, outbox.WithKey(inv.InvoiceID)))
		})
		if err != nil {
			return err
		}
	}
	r.Wake()
	fmt.Fprintln(stdout, "issued inv-1 (EUR), inv-2 (JPY) and inv-3 (a negative amount)")

	// "What failed in the last day, and why": the pending dead letters of that window.
	lastDay := deadletter.Filter{Status: deadletter.StatusPending, Since: time.Now().Add(-24 * time.Hour)}
	var (
		failed []deadletter.Entry
		lines  string
	)
	err = waitFor(ctx, "inv-1 in the report and two dead letters", func() (bool, error) {
		if lines, err = reportLines(ctx, pool); err != nil || !strings.Contains(lines, "inv-1") {
			return false, err
		}
		failed, err = dead.List(ctx, lastDay)
		return len(failed) == 2, err
	})
	if err != nil {
		return err
	}
	slices.SortFunc(failed, func(a, b deadletter.Entry) int { return strings.Compare(a.Message.Key, b.Message.Key) })
	fmt.Fprintf(stdout, "report: %s\n", lines)
	fmt.Fprintln(stdout, "dead letters that failed in the last day:")
	for _, e := range failed {
		fmt.Fprintf(stdout, "  %s  %s  consumer %s  attempts %d  reason: %s\n", e.Message.Key, e.Message.Type, e.Consumer, e.Attempts, e.Reason)
	}

	// Look at one, as `outbox dead-letters show` would.
	jpy, err := dead.Get(ctx, failed[0].ID)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "show %s: stage %s, status %s, body %s\n", jpy.Message.Key, jpy.Stage, jpy.Status, jpy.Message.Body)

	// Fix the bug (here: flip a flag; in life: deploy), then replay. Replay writes the event
	// back to the outbox with its own ID and marks the entry replayed, in one transaction.
	jpyFixed.Store(true)
	if err := dead.Replay(ctx, jpy.ID); err != nil {
		return err
	}
	r.Wake()
	err = waitFor(ctx, "inv-2 in the report", func() (bool, error) {
		lines, err = reportLines(ctx, pool)
		return strings.Contains(lines, "inv-2"), err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fixed the handler and replayed inv-2; report: %s\n", lines)

	// inv-3 is wrong at the source: discard it. The row stays, marked, for audit.
	if err := dead.Discard(ctx, failed[1].ID); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "discarded inv-3 (billing will reissue it)")

	fmt.Fprintf(stdout, "the same, in SQL:\n%s\n", operatorSQL)
	rows, err := pool.Query(ctx, operatorSQL)
	if err != nil {
		return err
	}
	type row struct {
		Key, Status string
		Attempts    int
		Reason      string
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return err
	}
	for _, r := range all {
		fmt.Fprintf(stdout, "  %-5s  %-9s  %d  %s\n", r.Key, r.Status, r.Attempts, r.Reason)
	}
	return nil
}

// reportLines renders the report table, e.g. "inv-1 120.00 EUR".
func reportLines(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var s string
	err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(invoice_id || ' ' || amount_eur || ' EUR', ', ' ORDER BY invoice_id), 'empty') FROM report_lines`).Scan(&s)
	return s, err
}

// waitFor polls cond until it holds, failing at ctx's end or after 20s.
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := cond()
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(fmt.Errorf("timed out waiting for %s", what), ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
