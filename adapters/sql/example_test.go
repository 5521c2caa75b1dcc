package outboxsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // pure-Go SQLite driver, registered as "sqlite"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	outboxmem "github.com/txoutbox/outbox/transports/memory"
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

	ob, err := outboxsql.New(outboxsql.SQLite, outbox.Tables{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx, db); err != nil {
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
	if err := ob.Publish(ctx, tx, outbox.New(FileUploaded{FileID: "f-1"}, outbox.WithKey("f-1"))); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// Relay: normally `go relay.Run(ctx)` next to a real transport.
	queue := outboxmem.New(nil)
	relay, err := outbox.NewRelay(ob.NewStore(db), queue, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil {
		log.Fatal(err)
	}
	for _, m := range queue.Sent() {
		fmt.Println(m.Type, m.Key, string(m.Body))
	}
	// Output: files.uploaded f-1 {"file_id":"f-1"}
}
