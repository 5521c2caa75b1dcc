package outboxrabbitmq_test

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
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

type orderPlaced struct {
	OrderID string `json:"order_id"`
	Note    string `json:"note,omitempty"`
}

func (orderPlaced) EventType() string { return "orders.placed" }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestEndToEnd: events committed with the caller's transaction go PostgreSQL outbox →
// relay → RabbitMQ → consumer, whose handler writes an effect row through
// outboxpgx.Idempotent. Every committed event takes effect exactly once, in per-key
// order; an event whose transaction rolled back never arrives.
//   - "standard": a plain quorum queue, 10 handlers at once;
//   - "ordered": a single-active-consumer queue and an ordered receiver, with every
//     seventh event failing its first attempt: retries are held in place, so per-key
//     order survives them.
func TestEndToEnd(t *testing.T) {
	for _, v := range []struct {
		name    string
		ordered bool
	}{{"standard", false}, {"ordered", true}} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			p := pgxtest.New(t, "outboxrabbitmq")
			d := newDestination(t, outboxrabbitmq.Topology{Ordered: v.ordered}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
			if _, err := p.Pool.Exec(context.Background(), "CREATE TABLE "+p.Schema+".effects (n bigserial, event_id uuid NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			relay, err := relay.New(p.Store(t), d.sender, &relay.Config{BatchSize: 50, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			c, err := consumer.New(d.receiver, &consumer.Config{
				Name: "e2e", DeadLetters: p.DeadLetters(t), RetryBackoff: 100 * time.Millisecond,
				MaxRetryBackoff: 200 * time.Millisecond, Logger: quiet,
			})
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu      sync.Mutex
				handled []outbox.Message // first successful handling of each event, in order
				failed  = map[uuid.UUID]bool{}
			)
			effect := outboxpgx.Idempotent(p.Outbox, p.Pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[orderPlaced]) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+p.Schema+".effects (event_id) VALUES ($1)", e.ID)
				return err
			}, nil)
			seq := 0
			consumer.Handle(c, func(ctx context.Context, e outbox.Event[orderPlaced]) error {
				mu.Lock()
				seq++
				fail := v.ordered && seq%7 == 0 && !failed[e.ID]
				if fail {
					failed[e.ID] = true
				}
				mu.Unlock()
				if fail {
					return fmt.Errorf("transient failure of %s", e.Payload.OrderID)
				}
				if err := effect(ctx, e); err != nil {
					return err
				}
				m, _ := e.Encode()
				mu.Lock()
				handled = append(handled, m)
				mu.Unlock()
				return nil
			})

			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := relay.Run(ctx); err != nil {
					t.Error(err)
				}
			})
			wg.Go(func() {
				if err := c.Run(ctx); err != nil {
					t.Error(err)
				}
			})
			defer func() { stop(); wg.Wait() }()

			var published []outbox.Encodable
			for tx := range 10 {
				var events []outbox.Encodable
				for i := range 20 {
					events = append(events, outbox.New(orderPlaced{OrderID: fmt.Sprintf("o-%d-%d", tx, i)},
						outbox.WithKey(fmt.Sprintf("customer-%d", i%4))))
				}
				p.Commit(t, events...)
				published = append(published, events...)
				relay.Wake()
			}
			rolledBack := outbox.New(orderPlaced{OrderID: "never"}, outbox.WithKey("customer-0"))
			tx, err := p.Pool.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Outbox.Publish(context.Background(), tx, rolledBack); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(context.Background()); err != nil {
				t.Fatal(err)
			}

			outboxtest.WaitFor(t, 60*time.Second, "every committed event to take effect", func() bool {
				return p.Count(t, "effects") >= len(published)
			})
			stop()
			wg.Wait()

			var effects, distinct int
			if err := p.Pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT event_id) FROM "+p.Schema+".effects").Scan(&effects, &distinct); err != nil {
				t.Fatal(err)
			}
			if effects != len(published) || distinct != len(published) {
				t.Errorf("%d effect rows for %d events, want exactly one for each of the %d committed", effects, distinct, len(published))
			}
			if n := p.Count(t, "outbox"); n != 0 {
				t.Errorf("%d events left in the outbox", n)
			}
			if n := p.Count(t, "outbox_dead_letters"); n != 0 {
				t.Errorf("%d dead letters", n)
			}
			for _, m := range handled {
				if m.ID == rolledBack.ID {
					t.Error("the rolled-back event was handled")
				}
			}
			outboxtest.CheckPerKeyOrder(t, published, handled)
			if v.ordered && len(failed) == 0 {
				t.Error("no event failed: the retries were not exercised")
			}
			t.Logf("%d events, %d failed once and were retried", len(published), len(failed))
		})
	}
}
