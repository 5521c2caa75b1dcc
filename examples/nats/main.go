// Command nats shows txoutbox with NATS JetStream, and the setup where people stumble: the
// relay publishes each event type to a subject under its prefix, so the stream must capture
// that prefix, and a consumer that handles some of the types filters on exactly their
// subjects (outboxnats.SubjectsFor computes them from the relay's own routing).
//
// Orders and a cart are written in PostgreSQL transactions together with their events
// (outboxpgx); the relay sends the committed events to the stream; a billing consumer
// charges each order once, in a transaction with its inbox row (outboxpgx.Idempotent), even
// when an event reaches the stream twice or is delivered twice.
//
// It needs PostgreSQL ($TXOUTBOX_PG_URL, default the local test server) and a nats-server
// with JetStream ($TXOUTBOX_NATS_URL, default nats://127.0.0.1:4222).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// OrderPlaced is published when an order is placed; billing charges it.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Cents   int64  `json:"cents"`
}

// EventType names the event on the wire, and the end of its NATS subject.
func (OrderPlaced) EventType() string { return "orders.placed" }

// CartAbandoned is published when a cart is left; billing does not handle it.
type CartAbandoned struct {
	CartID string `json:"cart_id"`
}

// EventType names the event on the wire.
func (CartAbandoned) EventType() string { return "carts.abandoned" }

// The example's own names, distinctive enough that dropping them at the start (what an
// interrupted earlier run left) touches nothing else on a shared server.
const (
	schema  = "txoutbox_example_nats" // PostgreSQL: the outbox, inbox and the shop's tables
	stream  = "TXOUTBOX_EXAMPLE_SHOP" // JetStream: the stream the relay fills
	prefix  = "txoutbox_example.shop" // the relay's SubjectPrefix; the stream captures prefix.>
	lostAck = "o-2"                   // its first delivery fails after the charge committed
)

type config struct {
	PGURL   string
	NATSURL string
}

func configFromEnv() config {
	return config{
		PGURL:   envOr("TXOUTBOX_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		NATSURL: envOr("TXOUTBOX_NATS_URL", "nats://127.0.0.1:4222"),
	}
}

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, configFromEnv()); err != nil {
		log.Fatal(err)
	}
}

// run places the orders, bills them and writes what happened to w.
func run(ctx context.Context, w io.Writer, cfg config) error {
	// PostgreSQL: the example's schema, first on the search_path, so the shop's SQL below
	// reads like an application's. Dropped at the start and at the end.
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
	if err := pool.Ping(ctx); err != nil {
		return &unreachable{"PostgreSQL", err}
	}
	dropSchema := func() error {
		_, err := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		return err
	}
	if err := dropSchema(); err != nil {
		return err
	}
	defer dropSchema()
	box, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		return err
	}
	if err := box.Migrate(ctx, pool); err != nil { // creates the schema too
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, cents bigint NOT NULL);
		CREATE TABLE carts (id text PRIMARY KEY, status text NOT NULL);
		CREATE TABLE charges (order_id text PRIMARY KEY, cents bigint NOT NULL)`); err != nil {
		return err
	}

	// NATS: the stream and billing's durable consumer. Production declares them in its
	// infrastructure code; Provision suits examples and tests.
	nc, err := nats.Connect(cfg.NATSURL, nats.Name("txoutbox-example-nats"))
	if err != nil {
		return &unreachable{"NATS", err}
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deleteStream := func() error {
		err := js.DeleteStream(context.WithoutCancel(ctx), stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		return err
	}
	if err := deleteStream(); err != nil {
		return err
	}
	defer deleteStream()

	// The relay's routing: the prefix, a dot, the event type. Stream makes the server
	// refuse a publish that lands in another stream, so a routing mistake fails loudly.
	routing := &outboxnats.SenderConfig{SubjectPrefix: prefix, Stream: stream}
	sender, err := outboxnats.NewSender(js, routing)
	if err != nil {
		return err
	}
	placedType, _ := outbox.EventTypeOf[OrderPlaced]()
	abandonedType, _ := outbox.EventTypeOf[CartAbandoned]()
	fmt.Fprintf(w, "txoutbox + NATS JetStream: PostgreSQL outbox → relay → stream %s → consumer billing\n", stream)
	fmt.Fprintf(w, "the relay publishes each event type under its prefix %q:\n", prefix)
	for _, typ := range []string{placedType, abandonedType} {
		subject, err := sender.SubjectFor(outbox.Message{Type: typ})
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  %-15s → %s\n", typ, subject)
	}

	// The stream captures the prefix and everything under it: every type the relay sends,
	// today's and those added later. A stream on other subjects leaves the relay's
	// publishes without responders: it pauses and waits, and nothing arrives.
	// Billing handles only orders.placed, so its consumer filters on that type's subject,
	// computed from the same routing as the relay's: the two cannot disagree.
	filter, err := outboxnats.SubjectsFor(routing, placedType)
	if err != nil {
		return err
	}
	top := outboxnats.Topology{Stream: stream, Subjects: []string{prefix + ".>"}, Consumer: "billing", FilterSubjects: filter}
	str, billingConsumer, err := outboxnats.Provision(ctx, js, top)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "stream %s captures %s\n", stream, strings.Join(top.Subjects, ", "))
	fmt.Fprintf(w, "consumer billing filters on %s (outboxnats.SubjectsFor of the types it handles)\n", strings.Join(filter, ", "))

	// The relay: committed events from the outbox to the stream.
	store, err := box.NewStore(pool)
	if err != nil {
		return err
	}
	r, err := relay.New(store, sender, nil)
	if err != nil {
		return err
	}

	// Billing charges an order in one transaction with its inbox row, so an order is
	// charged once however often its event is delivered. The first delivery of o-2 fails
	// after its charge committed, as when the ack never reaches the server: JetStream
	// delivers it again.
	receiver, err := outboxnats.NewReceiver(billingConsumer, &outboxnats.ReceiverConfig{MaxWait: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	dead, err := box.NewDeadLetters(pool)
	if err != nil {
		return err
	}
	billing, err := consumer.New(receiver, &consumer.Config{Name: "billing", DeadLetters: dead, RetryBackoff: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	charge := outboxpgx.Idempotent(box, pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[OrderPlaced]) error {
		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, cents) VALUES ($1, $2)", e.Payload.OrderID, e.Payload.Cents)
		return err
	}, nil)
	var mu sync.Mutex
	deliveries := map[string]int{} // handled deliveries per order, the failed one included
	consumer.Handle(billing, func(ctx context.Context, e outbox.Event[OrderPlaced]) error {
		err := charge(ctx, e)
		mu.Lock()
		deliveries[e.Payload.OrderID]++
		mu.Unlock()
		if info, _ := consumer.InfoFrom(ctx); err == nil && e.Payload.OrderID == lostAck && info.Attempt == 1 {
			return errors.New("connection lost before the ack")
		}
		return err
	})

	runCtx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	errs := make(chan error, 2)
	defer func() { stop(); running.Wait() }()
	running.Go(func() { errs <- r.Run(runCtx) })
	running.Go(func() { errs <- billing.Run(runCtx) })

	// inTx runs fn in a transaction of the shop's, which commits or not.
	inTx := func(commit bool, fn func(tx pgx.Tx) error) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := fn(tx); err != nil {
			return err
		}
		if !commit {
			return tx.Rollback(ctx)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		r.Wake() // same process: no need to wait for the relay's next poll
		return nil
	}
	orders := []OrderPlaced{{"o-1", 1250}, {"o-2", 700}, {"o-3", 3000}, {"o-4", 999}}
	var first outbox.Event[OrderPlaced]
	for _, o := range orders {
		e := outbox.New(o, outbox.WithKey(o.OrderID))
		if o.OrderID == "o-1" {
			first = e
		}
		err := inTx(o.OrderID != "o-4", func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO orders (id, cents) VALUES ($1, $2)", o.OrderID, o.Cents); err != nil {
				return err
			}
			return box.Publish(ctx, tx, e)
		})
		if err != nil {
			return err
		}
	}
	err = inTx(true, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO carts (id, status) VALUES ('c-1', 'abandoned')"); err != nil {
			return err
		}
		return box.Publish(ctx, tx, outbox.New(CartAbandoned{CartID: "c-1"}))
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "placed o-1, o-2 and o-3 and abandoned cart c-1, each row with its event in one transaction; o-4 rolled back")

	waitFor := func(what string, cond func() (bool, error)) error {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			ok, err := cond()
			if ok || err != nil {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("timed out waiting for %s", what)
			}
		}
	}
	stored := func() (uint64, error) {
		info, err := str.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.Msgs, nil
	}
	bySubject := func() (string, error) {
		info, err := str.Info(ctx, jetstream.WithSubjectFilter(prefix+".>"))
		if err != nil {
			return "", err
		}
		var parts []string
		for _, typ := range []string{placedType, abandonedType} {
			parts = append(parts, fmt.Sprintf("%d on %s.%s", info.State.Subjects[prefix+"."+typ], prefix, typ))
		}
		return strings.Join(parts, ", "), nil
	}
	if err := waitFor("the relay to send 4 events", func() (bool, error) { n, err := stored(); return n == 4, err }); err != nil {
		return err
	}
	counts, err := bySubject()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "the stream holds 4 messages: %s\n", counts)

	// A relay that crashed after publishing o-1's event and before deleting its outbox row
	// sends it again: same event ID, so same Nats-Msg-Id, and the stream drops the copy.
	m, err := first.Encode()
	if err != nil {
		return err
	}
	if err := sender.Send(ctx, []outbox.Message{m}); err != nil {
		return err
	}
	n, err := stored()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "o-1's event sent again (a relay that crashed before deleting it): the stream dropped the copy (same Nats-Msg-Id), %d messages\n", n)

	charged := func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM charges").Scan(&n)
		mu.Lock()
		defer mu.Unlock()
		return n == 3 && deliveries[lostAck] == 2, err
	}
	if err := waitFor("billing to charge the orders", charged); err != nil {
		return err
	}
	stop()
	running.Wait()
	for range 2 {
		if err := <-errs; err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "%s was delivered twice (its first delivery failed after the charge committed, as when the ack is lost): the inbox absorbed the second\n", lostAck)

	rows, err := pool.Query(ctx, "SELECT order_id, cents FROM charges ORDER BY order_id")
	if err != nil {
		return err
	}
	var lines []string
	for rows.Next() {
		var id string
		var cents int64
		if err := rows.Scan(&id, &cents); err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %d.%02d", id, cents/100, cents%100))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	info, err := billingConsumer.Info(ctx)
	if err != nil {
		return err
	}
	pending, err := dead.List(ctx, deadletter.Filter{Status: deadletter.StatusPending})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "billing charged %s, each once; never received c-1's event (not on its subject)\n", strings.Join(lines, ", "))
	fmt.Fprintf(w, "billing's consumer: %d pending, %d unacknowledged; dead letters: %d\n", info.NumPending, info.NumAckPending, len(pending))
	if n != 4 || len(lines) != 3 || info.NumPending != 0 || info.NumAckPending != 0 || len(pending) != 0 {
		return errors.New("nats example: unexpected outcome (see above)")
	}
	return nil
}

// unreachable is a service the example could not reach.
type unreachable struct {
	service string
	err     error
}

func (u *unreachable) Error() string { return "connecting to " + u.service + ": " + u.err.Error() }
func (u *unreachable) Unwrap() error { return u.err }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
