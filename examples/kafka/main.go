// Command kafka shows txoutbox with Kafka: orders placed in a database transaction go
// through the outbox and a relay to a Kafka topic, keyed by customer, and two shipping
// workers of one consumer group ship each customer's orders in the order they were placed,
// even when a shipment fails and is retried.
//
// With no flags it runs on an embedded SQLite file and an in-process Kafka cluster
// (franz-go's kfake, three brokers), so it needs nothing installed. -db postgres uses
// PostgreSQL ($TXOUTBOX_PG_URL, default the local test server); -brokers uses a real Kafka
// cluster instead of kfake.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// OrderPlaced is the event a placed order publishes.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
}

// EventType names the event on the wire.
func (OrderPlaced) EventType() string { return "orders.placed" }

const (
	partitions = 6
	jammed     = "o-02" // bob's first order: its first shipment fails
)

var customers = []string{"alice", "bob", "carol"}

func main() {
	dbKind := flag.String("db", "sqlite", "database: sqlite (embedded) or postgres")
	dsn := flag.String("dsn", "", "connection string (default: a temporary SQLite file, or $TXOUTBOX_PG_URL)")
	brokers := flag.String("brokers", "", "comma-separated Kafka brokers (default: an in-process kfake cluster)")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err := run(os.Stdout, *dbKind, *dsn, *brokers); err != nil {
		log.Fatal(err)
	}
}

// run places the orders, ships them and writes what happened to w.
func run(w io.Writer, kind, dsn, brokers string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A database of the run's own (a temporary SQLite file, or a schema created on the
	// PostgreSQL server) and a topic of its own, all removed at the end, so the demo never
	// meets an earlier run. In the database the outbox has its default table names.
	db, box, cleanup, err := open(ctx, kind, dsn)
	if err != nil {
		return err
	}
	defer cleanup()
	seeds, where := strings.Split(brokers, ","), "a Kafka cluster at "+brokers
	if brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(3)) // on loopback, free ports
		if err != nil {
			return err
		}
		defer cluster.Close()
		seeds, where = cluster.ListenAddrs(), "3 in-process brokers (kfake)"
	}
	fmt.Fprintf(w, "txoutbox + Kafka: %s outbox → relay → %s → 2 shipping workers\n", kind, where)

	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer producer.Close()
	topic := "kafka-example-" + suffix()
	admin := kadm.NewClient(producer)
	if _, err := admin.CreateTopic(ctx, partitions, -1, nil, topic); err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	defer func() { _, _ = admin.DeleteTopics(context.Background(), topic) }()

	if err := box.Migrate(ctx, db); err != nil {
		return err
	}
	// The shop's own tables. PostgreSQL and SQLite both take $1, $2… placeholders.
	serial := "INTEGER PRIMARY KEY AUTOINCREMENT"
	if box == outboxsql.Postgres {
		serial = "BIGSERIAL PRIMARY KEY"
	}
	for _, ddl := range []string{
		"CREATE TABLE orders (id VARCHAR(16) PRIMARY KEY, customer VARCHAR(16) NOT NULL)",
		"CREATE TABLE shipments (seq " + serial + ", order_id VARCHAR(16) NOT NULL, customer VARCHAR(16) NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return err
		}
	}

	// The relay: committed events from the outbox to the topic, keyed by customer.
	sender, err := outboxkafka.NewSender(producer, &outboxkafka.SenderConfig{Topic: topic})
	if err != nil {
		return err
	}
	store, err := box.NewStore(db)
	if err != nil {
		return err
	}
	r, err := relay.New(store, sender, nil)
	if err != nil {
		return err
	}
	// Two shipping workers in one consumer group share the partitions. Each ships an order
	// in one transaction with its inbox row, so a redelivered event ships nothing twice.
	// bob's first order, o-02, fails once, as if the label printer jammed.
	ship := outboxsql.Idempotent(box, db, func(ctx context.Context, tx *sql.Tx, e outbox.Event[OrderPlaced]) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO shipments (order_id, customer) VALUES ($1, $2)", e.Payload.OrderID, e.Payload.Customer)
		return err
	}, nil)
	dead, err := box.NewDeadLetters(db)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	errs := make(chan error, 3)
	defer func() { stop(); running.Wait() }()
	for range 2 {
		receiver, err := outboxkafka.NewReceiver(&outboxkafka.ReceiverConfig{Group: "shipping", Topics: []string{topic}, MaxWait: 500 * time.Millisecond},
			kgo.SeedBrokers(seeds...))
		if err != nil {
			return err
		}
		worker, err := consumer.New(receiver, &consumer.Config{Name: "shipping", DeadLetters: dead, RetryBackoff: 200 * time.Millisecond})
		if err != nil {
			return err
		}
		consumer.Handle(worker, func(ctx context.Context, e outbox.Event[OrderPlaced]) error {
			if info, _ := consumer.InfoFrom(ctx); e.Payload.OrderID == jammed && info.Attempt == 1 {
				return errors.New("label printer jammed")
			}
			return ship(ctx, e)
		})
		running.Go(func() {
			errs <- worker.Run(runCtx)
			_ = receiver.Close()
		})
	}
	running.Go(func() { errs <- r.Run(runCtx) })

	// place writes an order and its event in one transaction, which commits or not.
	place := func(id, customer string, commit bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, customer) VALUES ($1, $2)", id, customer); err != nil {
			return err
		}
		if err := box.Publish(ctx, tx, outbox.New(OrderPlaced{OrderID: id, Customer: customer}, outbox.WithKey(customer))); err != nil {
			return err
		}
		if !commit {
			return tx.Rollback()
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		r.Wake()
		return nil
	}
	const placed = 12
	for i := 1; i <= placed; i++ {
		if err := place(fmt.Sprintf("o-%02d", i), customers[(i-1)%len(customers)], true); err != nil {
			return err
		}
	}
	if err := place("o-13", "alice", false); err != nil {
		return err
	}
	fmt.Fprintf(w, "placed %d orders of alice, bob and carol, interleaved, each with its event in one transaction; o-13 rolled back\n", placed)

	count := func(query string, args ...any) int {
		var n int
		if err := db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
			log.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(time.Minute); count("SELECT count(*) FROM shipments") < placed; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for the orders to ship")
		}
	}

	// Where each customer's events went: read the topic back.
	parts, err := partitionsOf(ctx, seeds, topic, placed)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "each customer's events went to one partition (the record key is the customer):")
	for _, c := range customers {
		fmt.Fprintf(w, "  %-5s → partition %s\n", c, parts[c])
	}
	fmt.Fprintf(w, "bob's %s failed once (label printer jammed); it was retried, and bob's later orders waited for it\n", jammed)
	fmt.Fprintln(w, "each customer's orders shipped in the order they were placed:")
	ok := true
	for _, c := range customers {
		rows, err := db.QueryContext(ctx, "SELECT order_id FROM shipments WHERE customer = $1 ORDER BY seq", c)
		if err != nil {
			return err
		}
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		ok = ok && slices.IsSorted(ids) && len(ids) == placed/len(customers)
		fmt.Fprintf(w, "  %-6s %s\n", c+":", strings.Join(ids, " → "))
	}
	pending, err := dead.List(ctx, deadletter.Filter{Status: deadletter.StatusPending})
	if err != nil {
		return err
	}
	rolledBack := count("SELECT count(*) FROM shipments WHERE order_id = $1", "o-13")
	fmt.Fprintf(w, "o-13 shipped %d times; dead letters: %d\n", rolledBack, len(pending))
	stop()
	running.Wait()
	for range 3 {
		if err := <-errs; err != nil {
			return err
		}
	}
	if !ok || rolledBack != 0 || len(pending) != 0 {
		return errors.New("kafka example: unexpected outcome (see above)")
	}
	return nil
}

// partitionsOf reads the topic's first n records and returns each key's partitions.
func partitionsOf(ctx context.Context, seeds []string, topic string, n int) (map[string]string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	seen := map[string][]int32{}
	for got := 0; got < n; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, r := range fs.Records() {
			if k := string(r.Key); !slices.Contains(seen[k], r.Partition) {
				seen[k] = append(seen[k], r.Partition)
			}
			got++
		}
	}
	out := map[string]string{}
	for k, ps := range seen {
		var s []string
		for _, p := range ps {
			s = append(s, strconv.Itoa(int(p)))
		}
		out[k] = strings.Join(s, ", ")
	}
	return out, nil
}

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// open connects to a database of the run's own and returns it, the outbox of its dialect at
// the default table names, and the clean-up that removes the database: a temporary SQLite
// file (or the file dsn names, which stays), or a schema created on the PostgreSQL server
// dsn names.
func open(ctx context.Context, kind, dsn string) (*sql.DB, *outboxsql.Outbox, func(), error) {
	nothing := func() {}
	switch kind {
	case "sqlite":
		dir := ""
		if dsn == "" {
			var err error
			if dir, err = os.MkdirTemp("", "txoutbox-kafka-"); err != nil {
				return nil, nil, nothing, err
			}
			// WAL and a busy timeout let the producer, relay and workers share the file;
			// immediate transactions take the write lock up front instead of failing midway.
			dsn = "file:" + filepath.Join(dir, "kafka.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate"
		}
		db, err := sql.Open("sqlite", dsn)
		return db, outboxsql.SQLite, func() { db.Close(); _ = os.RemoveAll(dir) }, err
	case "postgres":
		if dsn == "" {
			dsn = os.Getenv("TXOUTBOX_PG_URL")
		}
		if dsn == "" {
			dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
		}
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, nil, nothing, err
		}
		schema := "txoutbox_kafka_" + suffix()
		pc.RuntimeParams["search_path"] = schema // the run's schema, where unqualified names go
		db := stdlib.OpenDB(*pc)
		if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
			db.Close()
			return nil, nil, nothing, err
		}
		return db, outboxsql.Postgres, func() { _, _ = db.Exec("DROP SCHEMA " + schema + " CASCADE"); db.Close() }, nil
	}
	return nil, nil, nothing, fmt.Errorf("-db %q: want sqlite or postgres", kind)
}
