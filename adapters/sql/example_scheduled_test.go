package outboxsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// ReminderDue is an event payload.
type ReminderDue struct {
	Order string `json:"order"`
}

func (ReminderDue) EventType() string { return "orders.reminder_due" }

// A scheduled event: published now, in the order's transaction, and sent no earlier than its
// time; a second one is cancelled in a later transaction (the order was paid) and never sent.
func ExampleOutbox_Cancel() {
	ctx := context.Background()
	db, done := migratedSQLite(ctx) // as in Example
	defer done()
	inTx := func(fn func(tx *sql.Tx) error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		defer tx.Rollback()
		if err := fn(tx); err != nil {
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
	}

	soon := outbox.New(ReminderDue{Order: "o-1"}, outbox.WithKey("o-1"), outbox.WithDelay(200*time.Millisecond))
	later := outbox.New(ReminderDue{Order: "o-2"}, outbox.WithKey("o-2"), outbox.WithDelay(time.Hour))
	inTx(func(tx *sql.Tx) error { return outboxsql.SQLite.Publish(ctx, tx, soon, later) })
	inTx(func(tx *sql.Tx) error {
		cancelled, err := outboxsql.SQLite.Cancel(ctx, tx, later.ID)
		fmt.Println("o-2's reminder cancelled:", cancelled)
		return err
	})

	store, err := outboxsql.SQLite.NewStore(db)
	if err != nil {
		log.Fatal(err)
	}
	st, err := store.(outboxdriver.StatsReader).Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("scheduled:", st.Scheduled)

	queue := outboxmemory.New(nil)
	r, err := relay.New(store, queue, nil)
	if err != nil {
		log.Fatal(err)
	}
	for len(queue.Sent()) == 0 { // a running relay (Run) does this by itself
		if _, err := r.RunOnce(ctx); err != nil {
			log.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("sent:", queue.Sent()[0].Key, "not before its time:", !time.Now().Before(soon.DeliverAt))
	// Output:
	// o-2's reminder cancelled: true
	// scheduled: 1
	// sent: o-1 not before its time: true
}
