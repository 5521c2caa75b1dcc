package outboxsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // pure-Go SQLite driver, registered as "sqlite"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// FileUploaded is an event payload.
type FileUploaded struct {
	FileID string `json:"file_id"`
}

func (FileUploaded) EventType() string { return "files.uploaded" }

// An application on database/sql writes a business row and its event in one transaction;
// a relay then delivers the event. SQLite runs in-process, so this example needs no server.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outboxsql-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// database/sql cannot tell the dialect: outboxsql.SQLite is the SQLite outbox at the
	// default table names (outboxsql.Postgres and outboxsql.MySQL are the others').
	if err := outboxsql.SQLite.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE files (id TEXT PRIMARY KEY, name TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	// Producer: the file row and its event commit together, or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO files (id, name) VALUES (?, ?)", "f-1", "report.csv"); err != nil {
		log.Fatal(err)
	}
	if err := outboxsql.SQLite.Publish(ctx, tx, outbox.New(FileUploaded{FileID: "f-1"}, outbox.WithKey("f-1"))); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// Relay: normally `go relay.Run(ctx)` next to a real transport.
	store, err := outboxsql.SQLite.NewStore(db)
	if err != nil {
		log.Fatal(err)
	}
	queue := outboxmemory.New(nil)
	r, err := relay.New(store, queue, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		log.Fatal(err)
	}
	for _, m := range queue.Sent() {
		fmt.Println(m.Type, m.Key, string(m.Body))
	}
	// Output: files.uploaded f-1 {"file_id":"f-1"}
}

// OrderCreated is an event payload.
type OrderCreated struct {
	OrderID string `json:"order_id"`
}

func (OrderCreated) EventType() string { return "orders.created" }

// An HTTP handler that creates an order and publishes its event runs once per
// Idempotency-Key: the client's retry gets the stored response, and no second order or
// event is written.
func ExampleOutbox_IdempotentHTTP() {
	ctx := context.Background()
	db, done := migratedSQLite(ctx) // as in Example
	defer done()
	if _, err := db.ExecContext(ctx, "CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, item TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	createOrder := outboxsql.SQLite.IdempotentHTTP(db, func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		res, err := tx.ExecContext(r.Context(), "INSERT INTO orders (item) VALUES (?)", r.FormValue("item"))
		if err != nil {
			return err
		}
		id, _ := res.LastInsertId()
		orderID := fmt.Sprintf("order-%d", id)
		if err := outboxsql.SQLite.Publish(r.Context(), tx, outbox.New(OrderCreated{OrderID: orderID}, outbox.WithKey(orderID))); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		_, err = fmt.Fprintln(w, orderID)
		return err
	}, &idempotency.HTTPConfig{
		// Keys are per client: here the basic-auth user, in an application the
		// authenticated account.
		Scope: func(r *http.Request) string { user, _, _ := r.BasicAuth(); return user },
	})

	for range 2 { // the client retries: its first response was lost on the way
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("item=book"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.SetBasicAuth("acme", "password")
		w := httptest.NewRecorder()
		createOrder.ServeHTTP(w, req)
		fmt.Print(w.Code, " ", w.Header().Get("Idempotent-Replayed"), " ", w.Body)
	}
	var orders, events int
	_ = db.QueryRowContext(ctx, "SELECT count(*) FROM orders").Scan(&orders)
	_ = db.QueryRowContext(ctx, "SELECT count(*) FROM outbox").Scan(&events)
	fmt.Println("orders:", orders, "events:", events)
	// Output:
	// 201  order-1
	// 201 true order-1
	// orders: 1 events: 1
}

// migratedSQLite opens a migrated SQLite outbox in a temporary directory, as Example does,
// for the other examples; done closes and removes it.
func migratedSQLite(ctx context.Context) (db *sql.DB, done func()) {
	dir, err := os.MkdirTemp("", "outboxsql-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		log.Fatal(err)
	}
	if err := outboxsql.SQLite.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	return db, func() {
		db.Close()
		os.RemoveAll(dir)
	}
}
