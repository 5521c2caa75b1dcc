package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/outboxtest"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// dbProxy forwards TCP connections to PostgreSQL, so a test can take "the database" down
// for its own pool alone: down resets every proxied connection and every new one (the
// client sees ECONNRESET, as when a server dies or a network drops), up lets them through
// again. The shared server is never touched.
type dbProxy struct {
	l      net.Listener
	target string
	down   atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newDBProxy(t testing.TB, target string) *dbProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dbProxy{l: l, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = l.Close()
		p.setDown(true)
		p.wg.Wait()
	})
	return p
}

func (p *dbProxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			reset(c)
			continue
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			reset(c)
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(b, c); reset(b) })
		p.wg.Go(func() { _, _ = io.Copy(c, b); reset(c) })
	}
}

// reset closes c with a TCP reset rather than an orderly close.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *dbProxy) setDown(down bool) {
	p.down.Store(down)
	if !down {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		reset(c)
	}
	p.conns = nil
}

// url is the test database's URL through the proxy.
func (p *dbProxy) url(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(pgxtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.l.Addr().String()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

// maxAttempt records the highest delivery count a receiver handed out.
type maxAttempt struct {
	outbox.Receiver
	max atomic.Int64
}

func (r *maxAttempt) Receive(ctx context.Context, n int) ([]outbox.Delivery, error) {
	ds, err := r.Receiver.Receive(ctx, n)
	for _, d := range ds {
		for a := int64(d.Attempt()); ; {
			cur := r.max.Load()
			if a <= cur || r.max.CompareAndSwap(cur, a) {
				break
			}
		}
	}
	return ds, err
}

type ledgerEntry struct {
	N      int  `json:"n"`
	Poison bool `json:"poison"`
}

func (ledgerEntry) EventType() string { return "test.ledger_entry" }

// TestConsumerSurvivesDatabaseOutage: events arrive through the in-memory broker while
// the database of the consumer's inbox and dead-letter table is down (its connections
// reset, new ones refused) for long enough that every message is delivered well past
// MaxAttempts. Nothing is dead-lettered for the outage and nothing acknowledged: the
// consumer pauses and probes. Once the database is back, each event's effect commits
// exactly once, and each poison event (a permanent failure, whose dead letter could not
// be written during the outage) is dead-lettered exactly once. With Idempotent's group
// commit and with one event per transaction.
func TestConsumerSurvivesDatabaseOutage(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*idempotency.GroupConfig{"Idempotent": nil, "IdempotentOneEventPerTransaction": {MaxEvents: 1}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			consumerSurvivesDatabaseOutage(t, cfg)
		})
	}
}

func consumerSurvivesDatabaseOutage(t *testing.T, group *idempotency.GroupConfig) {
	ctx := context.Background()
	o := pgxtest.New(t, "outage")
	if _, err := o.Pool.Exec(ctx, "CREATE TABLE "+o.Schema+".ledger (event_id uuid NOT NULL, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(pgxtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := newDBProxy(t, target.Host)
	cfg, err := pgxpool.ParseConfig(proxy.url(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	dead, err := o.NewDeadLetters(pool)
	if err != nil {
		t.Fatal(err)
	}

	q := outboxmemory.New(&outboxmemory.Config{VisibilityTimeout: 10 * time.Second})
	recv := &maxAttempt{Receiver: q}
	const maxAttempts = 2
	c, err := consumer.New(recv, &consumer.Config{Name: "ledger", DeadLetters: dead, Concurrency: 16, BatchSize: 16,
		MaxAttempts: maxAttempts, RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond,
		UnavailableBackoff: 5 * time.Millisecond, MaxUnavailableBackoff: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, e outbox.Event[ledgerEntry]) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+o.Schema+".ledger VALUES ($1, $2)", e.ID, e.Payload.N); err != nil {
			return err
		}
		if e.Payload.Poison {
			return outbox.Permanent(errors.New("poison"))
		}
		return nil
	}
	consumer.Handle(c, outboxpgx.Idempotent(o.Outbox, pool, h, group))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	n, poison := 0, 0
	send := func(count int) {
		var msgs []outbox.Message
		for range count {
			e := ledgerEntry{N: n, Poison: n%25 == 7}
			if e.Poison {
				poison++
			}
			m, err := outbox.New(e, outbox.WithKey(fmt.Sprint("acct-", n%10))).Encode()
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
			n++
		}
		if err := q.Send(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	send(50)
	outboxtest.WaitFor(t, 30*time.Second, "the first events to be settled", func() bool { return q.Len() == 0 })
	proxy.setDown(true)
	send(100) // arriving during the outage
	outboxtest.WaitFor(t, 30*time.Second, "the consumer to pause and deliveries to pass MaxAttempts", func() bool {
		return !c.State().UnavailableSince.IsZero() && recv.max.Load() >= 3*maxAttempts
	})
	if got := q.Len(); got != 100 {
		t.Fatalf("%d messages in the broker during the outage, want the 100 sent (none acknowledged)", got)
	}
	t.Logf("during the outage: %v", c.State().Err)
	proxy.setDown(false)
	outboxtest.WaitFor(t, 60*time.Second, "every event to be settled after the outage", func() bool { return q.Len() == 0 })

	var events, rows, dupes, deadLetters, deadDupes int
	if err := o.Pool.QueryRow(ctx, `SELECT count(DISTINCT event_id), count(*) FROM `+o.Schema+`.ledger`).Scan(&events, &rows); err != nil {
		t.Fatal(err)
	}
	dupes = rows - events
	if err := o.Pool.QueryRow(ctx, `SELECT count(*), count(*) - count(DISTINCT event_id) FROM `+o.Schema+`.outbox_dead_letters`).Scan(&deadLetters, &deadDupes); err != nil {
		t.Fatal(err)
	}
	if events != n-poison || dupes != 0 {
		t.Errorf("effects: %d events, %d duplicate rows; want %d events exactly once", events, dupes, n-poison)
	}
	if deadLetters != poison || deadDupes != 0 {
		t.Errorf("%d dead letters (%d repeated); want the %d poison events, once each, and none for the outage", deadLetters, deadDupes, poison)
	}
	if s := c.State(); !s.Healthy() {
		t.Errorf("State after the outage = %+v, want healthy", s)
	}
	t.Logf("highest delivery count %d (MaxAttempts %d)", recv.max.Load(), maxAttempts)
}
