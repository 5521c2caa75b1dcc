package outboxkafka_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
)

type orderPlaced struct {
	Customer string `json:"customer"`
	Seq      int    `json:"seq"` // the customer's order number, in commit order
}

func (orderPlaced) EventType() string { return "orders.placed" }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// pipeline is producers → PostgreSQL outbox → relays → Kafka → consumers → effects, each
// effect written through outboxpgx.Idempotent in the inbox's transaction.
type pipeline struct {
	t *testing.T
	p *pgxtest.Outbox

	mu        sync.Mutex
	committed map[uuid.UUID]orderPlaced
	seq       map[string]int // the next order number of each customer
	handled   int            // handler calls, duplicates and retries included
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	p := pgxtest.New(t, "outboxkafka")
	if _, err := p.Pool.Exec(context.Background(),
		"CREATE TABLE "+p.Schema+".effects (n bigserial PRIMARY KEY, event_id uuid NOT NULL, customer text NOT NULL, seq int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return &pipeline{t: t, p: p, committed: map[uuid.UUID]orderPlaced{}, seq: map[string]int{}}
}

// relay returns a relay over the pipeline's outbox, fast to retry.
func (pl *pipeline) relay(name string, s outbox.Sender) *relay.Relay {
	r, err := relay.New(pl.p.Store(pl.t), s, &relay.Config{
		Name: name, BatchSize: 100, Lease: 4 * time.Second, SendTimeout: 2 * time.Second,
		RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: time.Second, MaxAttempts: 1000,
		Logger: quiet(),
	})
	if err != nil {
		pl.t.Fatal(err)
	}
	return r
}

// consumer returns a consumer of r whose handler writes one effect per event, exactly
// once through the inbox.
func (pl *pipeline) consumer(r outbox.Receiver) *consumer.Consumer {
	c, err := consumer.New(r, &consumer.Config{
		Name: "billing", DeadLetters: pl.p.DeadLetters(pl.t), Concurrency: 20, BatchSize: 20,
		RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: 500 * time.Millisecond, MaxAttempts: 1000,
		Logger: quiet(),
	})
	if err != nil {
		pl.t.Fatal(err)
	}
	effect := outboxpgx.Idempotent(pl.p.Outbox, pl.p.Pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[orderPlaced]) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+pl.p.Schema+".effects (event_id, customer, seq) VALUES ($1, $2, $3)", e.ID, e.Payload.Customer, e.Payload.Seq)
		return err
	}, nil)
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[orderPlaced]) error {
		pl.mu.Lock()
		pl.handled++
		pl.mu.Unlock()
		return effect(ctx, e)
	})
	return c
}

// commit publishes one transaction with an order of each given customer, keyed by
// customer. Callers commit a customer's orders one transaction at a time.
func (pl *pipeline) commit(customers ...string) {
	pl.mu.Lock()
	var events []outbox.Encodable
	var sent []outbox.Event[orderPlaced]
	for _, c := range customers {
		e := outbox.New(orderPlaced{Customer: c, Seq: pl.seq[c]}, outbox.WithKey(c))
		pl.seq[c]++
		events = append(events, e)
		sent = append(sent, e)
	}
	pl.mu.Unlock()
	pl.p.Commit(pl.t, events...)
	pl.mu.Lock()
	for _, e := range sent {
		pl.committed[e.ID] = e.Payload
	}
	pl.mu.Unlock()
}

// run starts fn in a goroutine until the returned stop is called (or the test ends).
func run(t *testing.T, fn func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := fn(ctx); err != nil {
			t.Error(err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// effects returns the effect rows (count) and distinct events (distinct).
func (pl *pipeline) effects() (count, distinct int) {
	err := pl.p.Pool.QueryRow(context.Background(),
		"SELECT count(*), count(DISTINCT event_id) FROM "+pl.p.Schema+".effects").Scan(&count, &distinct)
	if err != nil {
		pl.t.Fatal(err)
	}
	return count, distinct
}

// awaitSettled waits until the outbox is empty and every committed event took effect.
func (pl *pipeline) awaitSettled(timeout time.Duration) {
	pl.t.Helper()
	pl.mu.Lock()
	want := len(pl.committed)
	pl.mu.Unlock()
	outboxtest.WaitFor(pl.t, timeout, fmt.Sprintf("the %d committed events to take effect", want), func() bool {
		_, distinct := pl.effects()
		return distinct >= want && pl.p.Count(pl.t, "outbox") == 0
	})
}

// verify checks, with everything stopped, that each committed event took effect exactly
// once, nothing else did, nothing was dead-lettered, and each customer's orders took effect
// in commit order.
func (pl *pipeline) verify() {
	t := pl.t
	t.Helper()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	count, distinct := pl.effects()
	if count != distinct || distinct != len(pl.committed) {
		t.Errorf("%d effect rows for %d events; %d events committed: want each exactly once", count, distinct, len(pl.committed))
	}
	if n := pl.p.Count(t, "outbox_dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	rows, err := pl.p.Pool.Query(context.Background(), "SELECT event_id, customer, seq FROM "+pl.p.Schema+".effects ORDER BY n")
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	for rows.Next() {
		var (
			id       uuid.UUID
			customer string
			seq      int
		)
		if err := rows.Scan(&id, &customer, &seq); err != nil {
			t.Fatal(err)
		}
		if want, ok := pl.committed[id]; !ok || want.Customer != customer || want.Seq != seq {
			t.Errorf("effect of event %s (%s #%d) that was not committed as such", id, customer, seq)
		}
		if seq != next[customer] {
			t.Errorf("customer %s: order #%d took effect when #%d was due", customer, seq, next[customer])
		}
		next[customer] = seq + 1
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events committed, each took effect once, in order per customer; %d handler calls", len(pl.committed), pl.handled)
}
