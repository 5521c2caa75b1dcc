package outboxpgx_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
)

const childEnv = "TXOUTBOX_CHILD_RELAY"

// tableSender records every delivery in a table of the test's schema, one committed INSERT
// per message, so a process killed mid-batch leaves exactly the deliveries it made.
type tableSender struct {
	pool  *pgxpool.Pool
	table string
	pause time.Duration // after each message, to widen the window for the kill
}

func (s tableSender) Send(ctx context.Context, msgs []outbox.Message) error {
	for _, m := range msgs {
		if _, err := s.pool.Exec(ctx, "INSERT INTO "+s.table+" (id) VALUES ($1)", m.ID.String()); err != nil {
			return err
		}
		time.Sleep(s.pause)
	}
	return nil
}

// runChildRelay is the relay process of TestSIGKILLMidBatchLosesNothing: it relays the
// schema named in the environment until it is killed.
func runChildRelay() {
	ctx := context.Background()
	schema := os.Getenv(childEnv)
	pool, err := pgxpool.New(ctx, pgxtest.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	o, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	store, err := o.NewStore(pool)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	relay, err := relay.New(store, tableSender{pool, schema + ".delivered", time.Millisecond},
		&relay.Config{Name: "child", BatchSize: 100, Lease: 2 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_ = relay.Run(ctx)
	os.Exit(0)
}

// TestSIGKILLMidBatchLosesNothing kills a relay process with SIGKILL while it is sending a
// batch, then lets another relay finish: every committed event is delivered at least once.
func TestSIGKILLMidBatchLosesNothing(t *testing.T) {
	o := newTestOutbox(t)
	ctx := context.Background()
	delivered := o.schema + ".delivered"
	if _, err := o.pool.Exec(ctx, "CREATE TABLE "+delivered+" (n bigserial, id uuid NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const total = 1000
	var events []outbox.Encodable
	for i := range total {
		key := ""
		if i%2 == 0 {
			key = fmt.Sprintf("key-%d", i%10)
		}
		events = append(events, outbox.New(outboxtestNote{N: i}, outbox.WithKey(key)))
	}
	f := o.fixture(t)
	if err := f.Publish(ctx, true, events...); err != nil {
		t.Fatal(err)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe)
	child.Env = append(os.Environ(), childEnv+"="+o.schema)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		if err := o.pool.QueryRow(ctx, "SELECT count(*) FROM "+delivered).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	outboxtest.WaitFor(t, 30*time.Second, "the child relay to deliver 250 events", func() bool { return count() >= 250 })
	if err := child.Process.Kill(); err != nil { // SIGKILL: no deferred code, no write-back
		t.Fatal(err)
	}
	_ = child.Wait()
	atKill := count()
	if atKill >= total {
		t.Fatalf("the child delivered everything (%d) before it was killed; the test proves nothing", atKill)
	}

	relay, err := relay.New(o.store(t), tableSender{pool: o.pool, table: delivered},
		&relay.Config{Name: "survivor", BatchSize: 100, Lease: 2 * time.Second, MaxPollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(rctx) }()
	outboxtest.WaitFor(t, 30*time.Second, "the survivor to drain the outbox", func() bool {
		n, err := f.Pending(ctx)
		return err == nil && n == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var missing, distinct, rows int
	err = o.pool.QueryRow(ctx, `SELECT count(DISTINCT id), count(*) FROM `+delivered).Scan(&distinct, &rows)
	if err != nil {
		t.Fatal(err)
	}
	missing = total - distinct
	if missing != 0 {
		t.Fatalf("%d of %d committed events were lost", missing, total)
	}
	if dl, _ := f.DeadLetters(ctx); len(dl) != 0 {
		t.Fatalf("%d events were dead-lettered", len(dl))
	}
	t.Logf("killed after %d deliveries; all %d events delivered, %d duplicate(s) from the killed batch", atKill, total, rows-distinct)
}

// outboxtestNote is the payload of this package's own tests.
type outboxtestNote struct {
	N int `json:"n"`
}

func (outboxtestNote) EventType() string { return "outboxpgx_test.note" }
