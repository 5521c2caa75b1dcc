// Command quickstart shows txoutbox end to end in one process: an upload creates a task and
// its "parse requested" event in one transaction, a relay delivers committed events, and a
// worker parses each file exactly once through the inbox.
//
// With no flags it runs on an embedded SQLite file and the in-memory transport, so it needs
// nothing installed. -db postgres or -db mysql runs the same on a server (DSN from -dsn, or
// $TXOUTBOX_PG_URL / $TXOUTBOX_MYSQL_DSN, defaulting to the local test servers).
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// ParseRequested asks the worker to parse an uploaded file.
type ParseRequested struct {
	TaskID string `json:"task_id"`
	File   string `json:"file"`
}

// EventType names the event on the wire.
func (ParseRequested) EventType() string { return "files.parse_requested" }

func main() {
	dbKind := flag.String("db", "sqlite", "database: sqlite (embedded), postgres or mysql")
	dsn := flag.String("dsn", "", "connection string (default: a temporary SQLite file, $TXOUTBOX_PG_URL or $TXOUTBOX_MYSQL_DSN)")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err := run(os.Stdout, *dbKind, *dsn); err != nil {
		log.Fatal(err)
	}
}

// run plays the three scenes and writes what happened to w.
func run(w io.Writer, kind, dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A database of the demo's own — a temporary SQLite file, or a schema (PostgreSQL) or
	// database (MySQL) created for this run — removed at the end, so the demo never meets
	// rows of an earlier run and leaves nothing behind. In it, the outbox has its default
	// table names, and the task table is the application's own.
	db, box, cleanup, err := open(ctx, kind, dsn)
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Fprintf(w, "txoutbox quickstart: %s + in-memory transport\n", kind)
	if err := box.Migrate(ctx, db); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE tasks (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, parses INTEGER NOT NULL)"); err != nil {
		return err
	}
	// The task SQL's one placeholder: PostgreSQL's and SQLite's $1, MySQL's ?.
	param := "$1"
	if box == outboxsql.MySQL {
		param = "?"
	}

	// The relay: committed events from the outbox to the broker.
	broker := outboxmemory.New(&outboxmemory.Config{VisibilityTimeout: time.Second})
	store, err := box.NewStore(db)
	if err != nil {
		return err
	}
	r, err := relay.New(store, broker, nil)
	if err != nil {
		return err
	}
	// The worker: parses the file and marks the task done, in one transaction with the
	// inbox row, so a redelivered event changes nothing.
	dead, err := box.NewDeadLetters(db)
	if err != nil {
		return err
	}
	worker, err := consumer.New(broker, &consumer.Config{Name: "parser", DeadLetters: dead})
	if err != nil {
		return err
	}
	consumer.Handle(worker, outboxsql.Idempotent(box, db, func(ctx context.Context, tx *sql.Tx, e outbox.Event[ParseRequested]) error {
		_, err := tx.ExecContext(ctx, "UPDATE tasks SET status = 'done', parses = parses + 1 WHERE id = "+param, e.Payload.TaskID)
		return err
	}, nil))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- r.Run(runCtx) }()
	go func() { done <- worker.Run(runCtx) }()
	defer func() { stop(); <-done; <-done }()

	// upload creates the task and its event in one transaction, which commits or not.
	upload := func(taskID string, commit bool) (outbox.Event[ParseRequested], error) {
		e := outbox.New(ParseRequested{TaskID: taskID, File: taskID + ".csv"}, outbox.WithKey(taskID))
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return e, err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO tasks (id, status, parses) VALUES ("+param+", 'pending', 0)", taskID); err != nil {
			return e, err
		}
		if err := box.Publish(ctx, tx, e); err != nil {
			return e, err
		}
		if !commit {
			return e, tx.Rollback()
		}
		if err := tx.Commit(); err != nil {
			return e, err
		}
		r.Wake() // same process: no need to wait for the next poll
		return e, nil
	}
	task := func(id string) (status string, parses int) {
		err := db.QueryRowContext(ctx, "SELECT status, parses FROM tasks WHERE id = "+param, id).Scan(&status, &parses)
		if errors.Is(err, sql.ErrNoRows) {
			return "absent", 0
		}
		if err != nil {
			log.Fatal(err)
		}
		return status, parses
	}
	waitFor := func(what string, cond func() bool) error {
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("timed out waiting for %s", what)
			}
		}
		return nil
	}

	// 1. Committed: the task and its event exist together; the worker parses it.
	first, err := upload("task-1", true)
	if err != nil {
		return err
	}
	if err := waitFor("task-1 to be parsed", func() bool { s, _ := task("task-1"); return s == "done" }); err != nil {
		return err
	}
	fmt.Fprintln(w, "committed:   task-1 and its event were written together; the relay delivered the event and the worker parsed the file")

	// 2. Rolled back: neither the task nor its event exists; nothing is delivered.
	if _, err := upload("task-2", false); err != nil {
		return err
	}
	if err := waitFor("the outbox to be empty", func() bool { return len(broker.Sent()) == 1 }); err != nil {
		return err
	}
	status, _ := task("task-2")
	relayed := len(broker.Sent())
	fmt.Fprintf(w, "rolled back: task-2 is %s and its event was never delivered (%d event sent in all)\n", status, relayed)

	// 3. Duplicate: the broker delivers task-1's event again (as after a relay crash between
	// send and delete); the inbox absorbs it.
	m, _ := first.Encode()
	if err := broker.Send(ctx, []outbox.Message{m}); err != nil {
		return err
	}
	if err := waitFor("the duplicate to be acknowledged", func() bool { return broker.Len() == 0 }); err != nil {
		return err
	}
	_, parses := task("task-1")
	fmt.Fprintf(w, "duplicate:   task-1's event was delivered twice; the worker parsed it %d time\n", parses)

	pending, err := dead.List(ctx, deadletter.Filter{Status: deadletter.StatusPending})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "dead letters: %d\n", len(pending))
	if status != "absent" || parses != 1 || len(pending) != 0 || relayed != 1 {
		return errors.New("quickstart: unexpected outcome (see above)")
	}
	return nil
}

// open connects to a database of the run's own and returns it, the outbox of its dialect at
// the default table names, and the clean-up that removes the database: a temporary SQLite
// file (or the file dsn names, which stays), or a schema (PostgreSQL) or database (MySQL)
// created on the server dsn names.
func open(ctx context.Context, kind, dsn string) (*sql.DB, *outboxsql.Outbox, func(), error) {
	nothing := func() {}
	name := fmt.Sprintf("txoutbox_quickstart_%08x", rand.Uint32())
	switch kind {
	case "sqlite":
		dir := ""
		if dsn == "" {
			var err error
			if dir, err = os.MkdirTemp("", "txoutbox-quickstart-"); err != nil {
				return nil, nil, nothing, err
			}
			// WAL and a busy timeout let the producer, relay and worker share the file;
			// immediate transactions take the write lock up front instead of failing midway.
			dsn = "file:" + filepath.Join(dir, "quickstart.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate"
		}
		db, err := sql.Open("sqlite", dsn)
		return db, outboxsql.SQLite, func() { db.Close(); removeDir(dir) }, err
	case "postgres":
		pc, err := pgx.ParseConfig(envOr(dsn, "TXOUTBOX_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
		if err != nil {
			return nil, nil, nothing, err
		}
		pc.RuntimeParams["search_path"] = name // the run's schema, where unqualified names go
		db := stdlib.OpenDB(*pc)
		if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
			db.Close()
			return nil, nil, nothing, err
		}
		return db, outboxsql.Postgres, func() { _, _ = db.Exec("DROP SCHEMA " + name + " CASCADE"); db.Close() }, nil
	case "mysql":
		mc, err := mysql.ParseDSN(envOr(dsn, "TXOUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true&multiStatements=true"))
		if err != nil {
			return nil, nil, nothing, err
		}
		mc.DBName = ""
		server, err := sql.Open("mysql", mc.FormatDSN())
		if err != nil {
			return nil, nil, nothing, err
		}
		if _, err := server.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			server.Close()
			return nil, nil, nothing, err
		}
		mc.DBName = name
		db, err := sql.Open("mysql", mc.FormatDSN())
		return db, outboxsql.MySQL, func() { db.Close(); _, _ = server.Exec("DROP DATABASE " + name); server.Close() }, err
	}
	return nil, nil, nothing, fmt.Errorf("-db %q: want sqlite, postgres or mysql", kind)
}

func removeDir(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// envOr returns value, or else the environment variable name, or else def.
func envOr(value, name, def string) string {
	if value != "" {
		return value
	}
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
