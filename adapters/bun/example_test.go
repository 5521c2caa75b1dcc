package outboxbun_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	_ "modernc.org/sqlite" // pure-Go SQLite driver, registered as "sqlite"

	"github.com/txoutbox/outbox"
	outboxbun "github.com/txoutbox/outbox/adapters/bun"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// File is a bun model.
type File struct {
	ID   string `bun:",pk"`
	Name string `bun:",notnull"`
}

// FileUploaded is an event payload.
type FileUploaded struct {
	FileID string `json:"file_id"`
}

func (FileUploaded) EventType() string { return "files.uploaded" }

// A bun application writes a row and its event in one db.RunInTx; a relay then delivers
// the event. SQLite runs in-process, so this example needs no server.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outboxbun-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sqldb, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		log.Fatal(err)
	}
	db := bun.NewDB(sqldb, sqlitedialect.New())
	defer db.Close()
	if err := outboxbun.Default.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.NewCreateTable().Model((*File)(nil)).Exec(ctx); err != nil {
		log.Fatal(err)
	}

	// Producer: the file row and its event commit together, or not at all.
	err = db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewInsert().Model(&File{ID: "f-1", Name: "report.csv"}).Exec(ctx); err != nil {
			return err
		}
		return outboxbun.Default.Publish(ctx, tx, outbox.New(FileUploaded{FileID: "f-1"}, outbox.WithKey("f-1")))
	})
	if err != nil {
		log.Fatal(err)
	}

	// Relay: normally `go relay.Run(ctx)` next to a real transport.
	store, err := outboxbun.Default.NewStore(db)
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
