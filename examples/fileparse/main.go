// Command fileparse is a file-upload service: an API accepts CSV uploads and a worker parses
// them, with Azure Queue Storage in between. The upload handler saves the file, its task and a
// "parse requested" event in one GORM transaction; the relay sends committed events to the
// queue; the worker parses each file exactly once, through outboxgorm's inbox, and publishes
// the parsed rows for a report. A big file's rows are over Azure Queue Storage's 64 KiB: they
// travel as a claim check, the body in Azure Blob Storage and a reference on the queue.
//
// It needs PostgreSQL ($TXOUTBOX_PG_URL), Azure Queue Storage ($TXOUTBOX_AZURITE_CONN) and
// Azure Blob Storage ($TXOUTBOX_AZURITE_BLOB_CONN), e.g. Azurite, all defaulting to the
// local test services.
package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/txoutbox/outbox"
	outboxgorm "github.com/txoutbox/outbox/adapters/gorm"
	"github.com/txoutbox/outbox/claimcheck"
	claimcheckazblob "github.com/txoutbox/outbox/claimcheck/azblob"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/relay"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// SourceFile is an uploaded file. (A real service would keep a storage path; the content keeps this short.)
type SourceFile struct {
	ID      string `gorm:"primaryKey"`
	Name    string
	Content []byte
}

// Task tracks the asynchronous parse of one file.
type Task struct {
	ID           string `gorm:"primaryKey"`
	SourceFileID string
	Status       string // pending, done
	Rows         int
}

// Record is one parsed CSV line.
type Record struct {
	ID       uint `gorm:"primaryKey"`
	TaskID   string
	Item     string
	Quantity int
}

// ParseRequested asks the worker to parse a file.
type ParseRequested struct {
	TaskID       string `json:"task_id"`
	SourceFileID string `json:"source_file_id"`
}

// EventType names the event on the wire.
func (ParseRequested) EventType() string { return "files.parse_requested" }

// FileParsed carries a parsed file's rows to the report. A big file's rows are over Azure
// Queue Storage's 64 KiB: the claim check sends them through blob storage.
type FileParsed struct {
	TaskID string `json:"task_id"`
	File   string `json:"file"`
	Rows   []Row  `json:"rows"`
}

// Row is one parsed line.
type Row struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// EventType names the event on the wire.
func (FileParsed) EventType() string { return "files.parsed" }

// retention is how long a claim-checked body is kept: longer than a message can wait in the
// queue (Azure Queue Storage keeps one 7 days by default) and be retried.
const retention = 8 * 24 * time.Hour

const (
	azuriteAccount  = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
	azuriteConn     = azuriteAccount + "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
	azuriteBlobConn = azuriteAccount + "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)

type config struct{ PGURL, AzureConn, AzureBlobConn string }

func configFromEnv() config {
	return config{
		PGURL:         envOr("TXOUTBOX_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		AzureConn:     envOr("TXOUTBOX_AZURITE_CONN", azuriteConn),
		AzureBlobConn: envOr("TXOUTBOX_AZURITE_BLOB_CONN", azuriteBlobConn),
	}
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, configFromEnv()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, stdout io.Writer, cfg config) error {
	// A fresh schema and queue per run, so runs never meet each other's rows or messages.
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	schema := "fileparse_" + suffix
	pc, err := pgx.ParseConfig(cfg.PGURL)
	if err != nil {
		return err
	}
	pc.RuntimeParams["search_path"] = schema
	sqlDB := stdlib.OpenDB(*pc)
	defer sqlDB.Close()
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	box, err := outboxgorm.New(outbox.Tables{Schema: schema})
	if err != nil {
		return err
	}
	if err := box.Migrate(ctx, db); err != nil { // creates the schema too
		return err
	}
	defer sqlDB.Exec("DROP SCHEMA " + schema + " CASCADE")
	// File names are unique, checked at COMMIT: a second sales.csv fails the commit after the
	// event was written, the old code's "queue sent, then the commit failed" case.
	if err := db.AutoMigrate(&SourceFile{}, &Task{}, &Record{}); err != nil {
		return err
	}
	if err := db.Exec("ALTER TABLE source_files ADD UNIQUE (name) DEFERRABLE INITIALLY DEFERRED").Error; err != nil {
		return err
	}

	az, err := azqueue.NewServiceClientFromConnectionString(cfg.AzureConn, nil)
	if err != nil {
		return err
	}
	queue := "fileparse-" + suffix
	sender, err := outboxazqueue.NewSender(az, &outboxazqueue.SenderConfig{DefaultQueue: queue})
	if err != nil {
		return err
	}
	if err := sender.CreateQueues(ctx); err != nil {
		return fmt.Errorf("creating the Azure queue: %w", err)
	}
	defer az.DeleteQueue(context.WithoutCancel(ctx), queue, nil)
	// The claim check: bodies over the queue's limit go to a blob container, and the queue
	// carries a reference (the CloudEvents dataref) that the worker resolves.
	blobContainer, err := container.NewClientFromConnectionString(cfg.AzureBlobConn, queue, nil)
	if err != nil {
		return err
	}
	if _, err := blobContainer.Create(ctx, nil); err != nil {
		return fmt.Errorf("creating the blob container: %w", err)
	}
	defer blobContainer.Delete(context.WithoutCancel(ctx), nil)
	blobs, err := claimcheckazblob.New(blobContainer, claimcheckazblob.Config{Prefix: "events/"})
	if err != nil {
		return err
	}
	checked, err := claimcheck.NewSender(sender, &claimcheck.SenderConfig{Store: blobs})
	if err != nil {
		return err
	}
	store, err := box.NewStore(db)
	if err != nil {
		return err
	}
	rl, err := relay.New(store, checked, nil)
	if err != nil {
		return err
	}

	// The worker: parse the file and mark its task done, in one transaction with the inbox row.
	receiver, err := outboxazqueue.NewReceiver(az.NewQueueClient(queue), &outboxazqueue.ReceiverConfig{MaxPollInterval: 100 * time.Millisecond, WaitTime: time.Second})
	if err != nil {
		return err
	}
	dead, err := box.NewDeadLetters(db)
	if err != nil {
		return err
	}
	worker, err := consumer.New(receiver, &consumer.Config{Name: "parser", DeadLetters: dead,
		Middleware: []consumer.Middleware{claimcheck.Resolve(blobs)}})
	if err != nil {
		return err
	}
	parse := outboxgorm.Idempotent(box, db, func(ctx context.Context, tx *gorm.DB, e outbox.Event[ParseRequested]) error {
		var file SourceFile
		if err := tx.First(&file, "id = ?", e.Payload.SourceFileID).Error; err != nil {
			return err
		}
		records, err := parseCSV(e.Payload.TaskID, file.Content)
		if err != nil {
			return outbox.Permanent(fmt.Errorf("%s: %w", file.Name, err)) // bad input: no retry helps
		}
		if err := tx.Create(&records).Error; err != nil {
			return err
		}
		if err := tx.Model(&Task{ID: e.Payload.TaskID}).Updates(Task{Status: "done", Rows: len(records)}).Error; err != nil {
			return err
		}
		// The result goes out through the outbox too, in the same transaction.
		parsed := FileParsed{TaskID: e.Payload.TaskID, File: file.Name, Rows: make([]Row, len(records))}
		for i, r := range records {
			parsed.Rows[i] = Row{Item: r.Item, Quantity: r.Quantity}
		}
		return box.Publish(ctx, tx, outbox.New(parsed, outbox.WithKey(file.ID)))
	}, nil)
	// handled passes each parse request the worker finished, duplicates included, to the
	// story below.
	handled := make(chan outbox.Event[ParseRequested], 10)
	consumer.Handle(worker, func(ctx context.Context, e outbox.Event[ParseRequested]) error {
		err := parse(ctx, e)
		if err == nil {
			rl.Wake() // the FileParsed event is committed: send it now
			handled <- e
		}
		return err
	})
	// The report receives each file's rows, resolved from blob storage when they were too big.
	reports := make(chan outbox.Event[FileParsed], 10)
	consumer.Handle(worker, func(ctx context.Context, e outbox.Event[FileParsed]) error {
		reports <- e
		return nil
	})
	report := func() error {
		e, err := receive(ctx, reports, "the report")
		if err != nil {
			return err
		}
		size, _ := json.Marshal(e.Payload)
		fmt.Fprintf(stdout, "report: %s, %d rows", e.Payload.File, len(e.Payload.Rows))
		if len(size) > 64<<10 {
			n := 0
			if err := blobs.List(ctx, func(claimcheck.Blob) bool { n++; return true }); err != nil {
				return err
			}
			fmt.Fprintf(stdout, " (%d KiB of JSON, over Azure Queue's 64 KiB: it came as a claim check, %d blob in storage)", len(size)>>10, n)
		}
		fmt.Fprintln(stdout)
		return nil
	}
	next := func() (outbox.Event[ParseRequested], error) { return receive(ctx, handled, "the worker") }
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- rl.Run(runCtx) }()
	go func() { done <- worker.Run(runCtx) }()
	defer func() { stop(); <-done; <-done }()

	// The API: POST /uploads?name=… with the CSV as the body.
	mux := http.NewServeMux()
	mux.HandleFunc("POST /uploads", func(w http.ResponseWriter, r *http.Request) {
		content, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		file := SourceFile{ID: uuid.NewString(), Name: r.URL.Query().Get("name"), Content: content}
		task := Task{ID: uuid.NewString(), SourceFileID: file.ID, Status: "pending"}
		// The file, its task and the parse request commit together, or none of them does.
		err = db.WithContext(r.Context()).Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&file).Error; err != nil {
				return err
			}
			if err := tx.Create(&task).Error; err != nil {
				return err
			}
			return box.Publish(r.Context(), tx, outbox.New(ParseRequested{TaskID: task.ID, SourceFileID: file.ID}, outbox.WithKey(file.ID)))
		})
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "23505": // unique_violation, at COMMIT
			http.Error(w, "a file named "+file.Name+" was already uploaded", http.StatusConflict)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			rl.Wake() // same process: send now rather than at the next poll
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, task.ID)
		}
	})
	api := httptest.NewServer(mux) // on 127.0.0.1, a free port
	defer api.Close()
	upload := func(name, body string) (status, reply string, err error) {
		resp, err := http.Post(api.URL+"/uploads?name="+name, "text/csv", strings.NewReader(body))
		if err != nil {
			return "", "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.Status, strings.TrimSpace(string(b)), err
	}
	count := func(model any) (n int64) { db.Model(model).Count(&n); return n }

	// parsed uploads a file the worker parses, and tells the story's reader: the upload, the
	// task, the report of its rows.
	parsed := func(name, content string) (outbox.Event[ParseRequested], error) {
		status, _, err := upload(name, content)
		if err != nil {
			return outbox.Event[ParseRequested]{}, err
		}
		fmt.Fprintf(stdout, "POST /uploads?name=%s: %s\n", name, status)
		e, err := next()
		if err != nil {
			return e, err
		}
		var task Task
		if err := db.First(&task, "id = ?", e.Payload.TaskID).Error; err != nil {
			return e, err
		}
		fmt.Fprintf(stdout, "worker: task %s, %d rows of %s parsed\n", task.Status, task.Rows, name)
		return e, report()
	}

	// 1. An upload commits; the worker parses the file.
	const sales = "item,quantity\napples,3\npears,5\nplums,2\n"
	first, err := parsed("sales.csv", sales)
	if err != nil {
		return err
	}

	// 2. An upload whose commit fails: no task, and no event for the relay to send.
	status, reply, err := upload("sales.csv", sales)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "POST /uploads?name=sales.csv: %s: %s\n", status, reply)
	var waiting int64 // events in the outbox that the relay has yet to send
	if err := waitFor(ctx, "the outbox to drain", func() bool {
		return db.Raw("SELECT count(*) FROM outbox").Scan(&waiting).Error == nil && waiting == 0
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "after it: tasks %d, events left in the outbox %d\n", count(&Task{}), waiting)

	// 3. A duplicate: the same message again, as from a relay that crashed after sending it
	// and before deleting its outbox row. The inbox absorbs it.
	again, err := first.Encode()
	if err != nil {
		return err
	}
	if err := sender.Send(ctx, []outbox.Message{again}); err != nil {
		return err
	}
	dup, err := next()
	if err != nil {
		return err
	}
	if dup.ID != first.ID || len(handled) > 0 {
		return errors.New("the worker received a parse request other than the re-sent one")
	}
	fmt.Fprintf(stdout, "duplicate: the worker got the same parse request again; sales.csv is still parsed once (%d records)\n", count(&Record{}))

	// 4. A big file: its parsed rows are over the queue's 64 KiB, so the relay puts them in
	// blob storage and sends a reference; the report gets them whole.
	var inventory strings.Builder
	inventory.WriteString("item,quantity\n")
	for i := range 3000 {
		fmt.Fprintf(&inventory, "item-%04d,%d\n", i, i%50)
	}
	if _, err := parsed("inventory.csv", inventory.String()); err != nil {
		return err
	}
	// Clean-up by age: a sweeper that runs after the retention removes the blob (in
	// production, a lifecycle management rule on the container's "events/" prefix does it).
	later := time.Now().Add(retention + time.Minute)
	swept, err := claimcheck.Sweep(ctx, blobs, later.Add(-retention))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "clean-up: a sweep %d days later deletes %d blob\n", retention/(24*time.Hour), swept)
	return nil
}

// parseCSV turns "item,quantity" lines, after a header line, into records of one task.
func parseCSV(taskID string, content []byte) ([]Record, error) {
	lines, err := csv.NewReader(bytes.NewReader(content)).ReadAll()
	if err != nil || len(lines) < 2 {
		return nil, errors.Join(errors.New("not a CSV file with a header and rows"), err)
	}
	records := make([]Record, 0, len(lines)-1)
	for i, l := range lines[1:] { // the reader checked every line has the header's 2 fields
		qty, err := strconv.Atoi(l[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: quantity %q is not a number", i+2, l[1])
		}
		records = append(records, Record{TaskID: taskID, Item: l[0], Quantity: qty})
	}
	return records, nil
}

// receive returns the next value of ch, failing at ctx's end or after 20s.
func receive[T any](ctx context.Context, ch <-chan T, what string) (T, error) {
	var zero T
	select {
	case v := <-ch:
		return v, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-time.After(20 * time.Second):
		return zero, errors.New("timed out waiting for " + what)
	}
}

// waitFor polls cond until it holds, failing at ctx's end or after 20s.
func waitFor(ctx context.Context, what string, cond func() bool) error {
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(fmt.Errorf("timed out waiting for %s", what), ctx.Err())
		}
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
