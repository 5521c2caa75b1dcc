package outboxgorm_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/glebarez/sqlite" // pure-Go SQLite for GORM
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/txoutbox/outbox"
	outboxgorm "github.com/txoutbox/outbox/adapters/gorm"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// File is a GORM model.
type File struct {
	ID   string
	Name string
}

// FileUploaded is an event payload.
type FileUploaded struct {
	FileID string `json:"file_id"`
}

func (FileUploaded) EventType() string { return "files.uploaded" }

// A GORM application writes a row and its event in one db.Transaction; a relay then
// delivers the event. SQLite runs in-process, so this example needs no server.
func Example() {
	dir, err := os.MkdirTemp("", "outboxgorm-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	ctx := context.Background()
	if err := outboxgorm.Default.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&File{}); err != nil {
		log.Fatal(err)
	}

	// Producer: the file row and its event commit together, or not at all.
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&File{ID: "f-1", Name: "report.csv"}).Error; err != nil {
			return err
		}
		return outboxgorm.Default.Publish(ctx, tx, outbox.New(FileUploaded{FileID: "f-1"}, outbox.WithKey("f-1")))
	})
	if err != nil {
		log.Fatal(err)
	}

	// Relay: normally `go relay.Run(ctx)` next to a real transport.
	store, err := outboxgorm.Default.NewStore(db)
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
