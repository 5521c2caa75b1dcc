package outboxsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dialects are the databases every test runs on, with the driver each opens.
var dialects = []struct {
	name    string
	dialect *outboxsql.Outbox // the dialect's outbox at the default names
	driver  string
}{
	{"postgres", outboxsql.Postgres, "pgx"},
	{"mysql", outboxsql.MySQL, "mysql"},
	{"sqlite", outboxsql.SQLite, "sqlite"},
}

type testOutbox struct {
	*outboxsql.Outbox
	*sqlstoretest.Target
}

// newTestOutbox migrates a fresh outbox of d's dialect (see sqlstoretest.New): d itself
// where the outbox has the default names (SQLite), one from New otherwise.
func newTestOutbox(t testing.TB, name string, d *outboxsql.Outbox, driver string) *testOutbox {
	t.Helper()
	tg := sqlstoretest.New(t, name, func(dsn string) (*sql.DB, error) { return sql.Open(driver, dsn) })
	o := d
	if !tg.DefaultNames() {
		var err error
		if o, err = outboxsql.New(d, tg.Tables); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Migrate(context.Background(), tg.DB); err != nil {
		t.Fatal(err)
	}
	return &testOutbox{Outbox: o, Target: tg}
}

// store is the outbox's relay store.
func (o *testOutbox) store(t testing.TB) outboxdriver.Store {
	t.Helper()
	s, err := o.NewStore(o.DB)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// inTx runs fn in one BeginTx transaction, committed, or rolled back when commit is false.
func (o *testOutbox) inTx(ctx context.Context, commit bool, fn func(tx *sql.Tx) error) error {
	tx, err := o.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	if !commit {
		return tx.Rollback()
	}
	return tx.Commit()
}

// publish is the fixtures' Publish, in one transaction.
func (o *testOutbox) publish(ctx context.Context, commit bool, events ...outbox.Encodable) error {
	return o.inTx(ctx, commit, func(tx *sql.Tx) error { return o.Publish(ctx, tx, events...) })
}

// cancel is the fixtures' Cancel, in one transaction.
func (o *testOutbox) cancel(ctx context.Context, commit bool, id uuid.UUID) (ok bool, err error) {
	err = o.inTx(ctx, commit, func(tx *sql.Tx) (err error) { ok, err = o.Cancel(ctx, tx, id); return err })
	return ok, err
}

// fixture is the store suite's fixture over o.
func (o *testOutbox) fixture(t testing.TB) *outboxtest.StoreFixture {
	f := o.Fixture(o.store(t), o.publish)
	f.Cancel = o.cancel
	f.PublishNilTx = func(ctx context.Context, events ...outbox.Encodable) error {
		var tx *sql.Tx
		return o.Publish(ctx, tx, events...)
	}
	return f
}

func TestConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseStore(t, func(t *testing.T) *outboxtest.StoreFixture {
				o := newTestOutbox(t, d.name, d.dialect, d.driver)
				return o.fixture(t)
			})
		})
	}
	// MySQL without parseTime=true returns DATETIME as text; the store reads both.
	t.Run("mysql-without-parseTime", func(t *testing.T) {
		t.Parallel()
		outboxtest.ExerciseStore(t, func(t *testing.T) *outboxtest.StoreFixture {
			tg := sqlstoretest.New(t, "mysql", func(dsn string) (*sql.DB, error) {
				return sql.Open("mysql", strings.ReplaceAll(dsn, "parseTime=true", "parseTime=false"))
			})
			ob, err := outboxsql.New(outboxsql.MySQL, tg.Tables)
			if err != nil {
				t.Fatal(err)
			}
			if err := ob.Migrate(context.Background(), tg.DB); err != nil {
				t.Fatal(err)
			}
			o := &testOutbox{Outbox: ob, Target: tg}
			return o.fixture(t)
		})
	})
}

type OrderPlaced struct {
	OrderID int64 `json:"order_id"`
}

func (OrderPlaced) EventType() string { return "orders.placed" }

// TestBusinessRowAndEventCommitTogether: an order row and its event, written in one BeginTx
// transaction, are both there after commit and both gone after rollback.
func TestBusinessRowAndEventCommitTogether(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := newTestOutbox(t, d.name, d.dialect, d.driver)
			orders := o.Table("orders")
			if _, err := o.DB.ExecContext(ctx, "CREATE TABLE "+orders+" (id BIGINT PRIMARY KEY, total BIGINT NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			placeOrder := func(id int64, commit bool) {
				tx, err := o.DB.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, rebind(d.name, "INSERT INTO "+orders+" (id, total) VALUES (?, ?)"), id, 42); err != nil {
					t.Fatal(err)
				}
				if err := o.Publish(ctx, tx, outbox.New(OrderPlaced{id}, outbox.WithKey("order"))); err != nil {
					t.Fatal(err)
				}
				if commit {
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
			}
			placeOrder(1, true)
			placeOrder(2, false)

			var rows int
			if err := o.DB.QueryRowContext(ctx, "SELECT count(*) FROM "+orders).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			q := outboxmemory.New(nil)
			relay, err := relay.New(o.store(t), q, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := relay.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			sent := q.Sent()
			if rows != 1 || len(sent) != 1 {
				t.Fatalf("%d order rows and %d events delivered, want 1 and 1", rows, len(sent))
			}
			e, err := outbox.Decode[OrderPlaced](sent[0])
			if err != nil || e.Payload.OrderID != 1 {
				t.Fatalf("delivered %+v (%v), want order 1", e, err)
			}
		})
	}
}

// rebind turns ? placeholders into PostgreSQL's $n.
func rebind(dialect, query string) string {
	if dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$")
			b.WriteString(string(rune('0' + n)))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// TestMigrate runs the migration suite on every dialect, through the dialect's default
// outbox where the outbox has the default names (SQLite).
func TestMigrate(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseMigrate(t, func(t *testing.T) *outboxtest.MigrateFixture[*sql.Tx] {
				tg := sqlstoretest.New(t, d.name, func(dsn string) (*sql.DB, error) { return sql.Open(d.driver, dsn) })
				o := d.dialect
				if !tg.DefaultNames() {
					var err error
					if o, err = outboxsql.New(d.dialect, tg.Tables); err != nil {
						t.Fatal(err)
					}
				}
				return &outboxtest.MigrateFixture[*sql.Tx]{
					Migrate:   func(ctx context.Context) error { return o.Migrate(ctx, tg.DB) },
					MigrateTx: o.MigrateTx,
					Validate:  func(ctx context.Context) error { return o.Validate(ctx, tg.DB) },
					InTx: func(ctx context.Context, fn func(*sql.Tx) error) error {
						tx, err := tg.DB.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						if err := fn(tx); err != nil {
							return errors.Join(err, tx.Rollback())
						}
						return tx.Commit()
					},
					Migrated:   tg.Migrated,
					Versions:   tg.Versions(),
					DDLCommits: d.name == "mysql",
				}
			})
		})
	}
}

func TestPublishNeedsATransaction(t *testing.T) {
	if err := outboxsql.SQLite.Publish(context.Background(), nil, outbox.New(OrderPlaced{1})); !errors.Is(err, outbox.ErrNotInTransaction) {
		t.Fatalf("Publish(nil tx) = %v, want ErrNotInTransaction", err)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := outboxsql.New(nil, outbox.Tables{}); err == nil {
		t.Error("New without a dialect succeeded")
	}
	if _, err := outboxsql.New(outboxsql.MySQL, outbox.Tables{Outbox: "out; DROP TABLE x"}); err == nil {
		t.Error("New accepted a table name that is not an identifier")
	}
}

// TestMySQLRejectsOverlongFields: a key longer than its VARCHAR(255) column fails Publish
// with the limit named, instead of being truncated by a non-strict server.
func TestMySQLRejectsOverlongFields(t *testing.T) {
	ctx := context.Background()
	o := newTestOutbox(t, "mysql", outboxsql.MySQL, "mysql")
	if _, err := o.DB.ExecContext(ctx, "SET SESSION sql_mode = ''"); err != nil {
		t.Fatal(err)
	}
	err := o.publish(ctx, true, outbox.New(OrderPlaced{1}, outbox.WithKey(strings.Repeat("k", 256))))
	if err == nil || !strings.Contains(err.Error(), "over the column limit of 255") {
		t.Fatalf("Publish with a 256-character key: %v", err)
	}
}

// TestLargeBatchSplitsStatements: more events than one statement takes, with bodies past
// the per-statement byte budget, arrive whole and in order.
func TestLargeBatchSplitsStatements(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := newTestOutbox(t, d.name, d.dialect, d.driver)
			var events []outbox.Encodable
			for i := range 1500 {
				text := ""
				if i%100 == 0 {
					text = strings.Repeat("x", 300<<10)
				}
				events = append(events, outbox.New(outboxtest.Note{Text: text, N: i}, outbox.WithKey("k")))
			}
			if err := o.publish(ctx, true, events...); err != nil {
				t.Fatal(err)
			}
			store := o.store(t)
			var got []outboxdriver.Claimed
			for len(got) < len(events) {
				c, err := store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 1, Limit: 1000, Lease: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				if len(c) == 0 {
					t.Fatalf("claimed %d of %d", len(got), len(events))
				}
				got = append(got, c...)
				seqs := make([]int64, len(c))
				for i, x := range c {
					seqs[i] = x.Seq
				}
				if err := store.Complete(ctx, 1, seqs); err != nil {
					t.Fatal(err)
				}
			}
			for i, c := range got {
				want, _ := events[i].Encode()
				if err := outboxtest.SameMessage(c.Message, want); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
		})
	}
}

// TestIdempotency runs the idempotency suite on every dialect: through the dialect's default
// outbox where the outbox has the default names (SQLite), through one from New otherwise.
func TestIdempotency(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseIdempotency(t, func(t *testing.T) *outboxtest.IdempotencyFixture[*sql.Tx] {
				return newTestOutbox(t, d.name, d.dialect, d.driver).idempotencyFixture(t)
			})
		})
	}
}

func (o *testOutbox) idempotencyFixture(t *testing.T) *outboxtest.IdempotencyFixture[*sql.Tx] {
	effects := o.EffectsTable(t)
	insert := o.Rebind("INSERT INTO " + effects + " (id, text) VALUES (?, ?)")
	f := &outboxtest.IdempotencyFixture[*sql.Tx]{
		Effect: func(ctx context.Context, tx *sql.Tx, id, text string) error {
			_, err := tx.ExecContext(ctx, insert, id, text)
			return err
		},
		Effects:   func(ctx context.Context) (map[string]int, error) { return o.CountByText(ctx, effects) },
		Pending:   o.Pending,
		AgeInbox:  o.AgeInbox,
		SQL:       o.RawSQL(),
		Unmigrate: o.Unmigrate,
		Publish: func(ctx context.Context, tx *sql.Tx, events ...outbox.Encodable) error {
			return o.Publish(ctx, tx, events...)
		},
		Idempotent: func(h idempotency.TxHandler[*sql.Tx, outboxtest.Note], cfg *idempotency.GroupConfig) consumer.Handler[outboxtest.Note] {
			return outboxsql.Idempotent(o.Outbox, o.DB, outboxsql.TxHandler[outboxtest.Note](h), cfg)
		},
		SkipSeen: func(h consumer.Handler[outboxtest.Note]) consumer.Handler[outboxtest.Note] {
			return outboxsql.SkipSeen(o.Outbox, o.DB, h)
		},
		IdempotentHTTP: func(h idempotency.HTTPTxHandler[*sql.Tx], cfg *idempotency.HTTPConfig) http.Handler {
			return o.IdempotentHTTP(o.DB, h, cfg)
		},
		PruneInbox: func(ctx context.Context, retention time.Duration, limit int) (int64, error) {
			return o.PruneInbox(ctx, o.DB, retention, limit)
		},
	}
	var err error
	f.Store, err = o.NewStore(o.DB)
	if err == nil {
		f.DeadLetters, err = o.NewDeadLetters(o.DB)
	}
	if err == nil {
		f.Inbox, err = o.NewInbox(o.DB)
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestContextIsHonoured: a cancelled context stops Publish and the store's calls with the
// context's error.
func TestContextIsHonoured(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			o := newTestOutbox(t, d.name, d.dialect, d.driver)
			tx, err := o.DB.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := o.Publish(ctx, tx, outbox.New(OrderPlaced{1})); !errors.Is(err, context.Canceled) {
				t.Errorf("Publish with a cancelled context = %v, want context.Canceled", err)
			}
			if _, err := o.store(t).Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 1, Limit: 10, Lease: time.Minute}); !errors.Is(err, context.Canceled) {
				t.Errorf("Claim with a cancelled context = %v, want context.Canceled", err)
			}
			if err := o.Migrate(ctx, o.DB); !errors.Is(err, context.Canceled) {
				t.Errorf("Migrate with a cancelled context = %v, want context.Canceled", err)
			}
		})
	}
}

// TestRelayDeadLetterRoundTrip: a message the relay dead-letters reads back whole from the
// dead-letter table, with the database clock's failure times, and a replay puts the same
// message back into the outbox.
func TestRelayDeadLetterRoundTrip(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := newTestOutbox(t, d.name, d.dialect, d.driver)
			e := outbox.New(OrderPlaced{7}, outbox.WithKey("o-7"), outbox.WithHeader("h", "v"))
			if err := o.publish(ctx, true, e); err != nil {
				t.Fatal(err)
			}
			store := o.store(t)
			c, err := store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 3, Limit: 10, Lease: time.Minute})
			if err != nil || len(c) != 1 {
				t.Fatalf("claim: %d, %v", len(c), err)
			}
			if err := store.Retry(ctx, 3, []outboxdriver.Retry{{Seq: c[0].Seq, Delay: 0, Error: "first failure"}}); err != nil {
				t.Fatal(err)
			}
			if c, err = store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 4, Limit: 10, Lease: time.Minute}); err != nil || len(c) != 1 || c[0].Attempts != 2 {
				t.Fatalf("second claim: %+v, %v", c, err)
			}
			before := time.Now().Add(-time.Minute)
			if moved, err := store.DeadLetter(ctx, 4, []outboxdriver.DeadLetter{{Seq: c[0].Seq, Reason: "broker says no"}}); err != nil || len(moved) != 1 || moved[0] != c[0].Seq {
				t.Fatalf("DeadLetter moved %v (%v), want [%d]", moved, err, c[0].Seq)
			}
			dl, err := o.NewDeadLetters(o.DB)
			if err != nil {
				t.Fatal(err)
			}
			entries, err := dl.List(ctx, deadletter.Filter{Stage: deadletter.StageRelay, Since: before})
			if err != nil || len(entries) != 1 {
				t.Fatalf("List: %d entries, %v", len(entries), err)
			}
			got := entries[0]
			want, _ := e.Encode()
			if err := outboxtest.SameMessage(got.Message, want); err != nil {
				t.Error(err)
			}
			after := time.Now().Add(time.Minute)
			if got.Reason != "broker says no" || got.Attempts != 2 || got.Status != deadletter.StatusPending ||
				got.FirstFailedAt.Before(before) || got.LastFailedAt.After(after) || got.LastFailedAt.Before(got.FirstFailedAt) {
				t.Fatalf("dead letter %+v", got)
			}
			if err := dl.Replay(ctx, got.ID); err != nil {
				t.Fatal(err)
			}
			c, err = store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 5, Limit: 10, Lease: time.Minute})
			if err != nil || len(c) != 1 || c[0].Attempts != 1 {
				t.Fatalf("claim after replay: %+v, %v", c, err)
			}
			if err := outboxtest.SameMessage(c[0].Message, want); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestSQLiteSeveralRelaysKeepOrder: SQLite is documented for one relay per file, but
// several are still safe: each claim is one write statement, so claims are serialised by
// SQLite's single writer and per-key order holds under retries.
func TestSQLiteSeveralRelaysKeepOrder(t *testing.T) {
	o := newTestOutbox(t, "sqlite", outboxsql.SQLite, "sqlite")
	var events []outbox.Encodable
	for i := range 30 {
		for k := range 4 {
			events = append(events, outbox.New(outboxtest.Note{N: i}, outbox.WithKey(fmt.Sprintf("key-%d", k))))
		}
	}
	if err := o.publish(context.Background(), true, events...); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	q := outboxmemory.New(&outboxmemory.Config{SendHook: func(outbox.Message) error {
		if calls.Add(1)%4 == 0 {
			return errors.New("broker hiccup")
		}
		return nil
	}})
	cfg := &relay.Config{Name: "sqlite", BatchSize: 5, MaxAttempts: 1000, Lease: 2 * time.Second,
		SendTimeout: time.Second, MinPollInterval: time.Millisecond, MaxPollInterval: 10 * time.Millisecond,
		RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond}
	outboxtest.RunRelays(t, o.store(t), q, 3, cfg, func() bool { return len(q.Sent()) >= len(events) })
	outboxtest.CheckPerKeyOrder(t, events, q.Sent())
}

// TestMigration3KeepsOldDeadLetters: upgrading a version-2 outbox keeps its dead letters,
// turns the all-zero event ID of old malformed messages into NULL, classifies old entries
// by their reasons, and leaves a table that takes entries without an event ID; migrating
// again changes nothing.
func TestMigration3KeepsOldDeadLetters(t *testing.T) {
	ctx := context.Background()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			tg := sqlstoretest.New(t, d.name, func(dsn string) (*sql.DB, error) { return sql.Open(d.driver, dsn) })
			sd, _ := sqlstore.Lookup(d.name)
			n, err := sqlstore.NewNames(sd, tg.Tables)
			if err != nil {
				t.Fatal(err)
			}
			exec := func(q string) {
				t.Helper()
				if _, err := tg.DB.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			migrations := map[string]string{
				"postgres": "CREATE TABLE " + n.Migrations + " (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
				"mysql":    "CREATE TABLE " + n.Migrations + " (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL)",
				"sqlite":   "CREATE TABLE " + n.Migrations + " (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
			}[d.name]
			if d.name == "postgres" {
				exec("CREATE SCHEMA " + tg.Tables.Schema)
			}
			exec(migrations)
			for _, m := range sd.Migrations()[:2] {
				script, err := sqlstore.Render(sd, m, n)
				if err != nil {
					t.Fatal(err)
				}
				exec(script)
				exec(fmt.Sprintf("INSERT INTO %s (version, name, applied_at) VALUES (%d, '%s', '2024-01-01 00:00:00')", n.Migrations, m.Version, m.Name))
			}
			now := map[string]string{"postgres": "now()", "mysql": "UTC_TIMESTAMP(6)", "sqlite": "'2024-01-01 00:00:00.000'"}[d.name]
			old := []struct{ id, reason string }{
				{"00000000-0000-0000-0000-000000000000", "undecodable message: outbox: malformed message: no ce-id"},
				{"0190a1b2-0000-7000-8000-000000000001", `no handler for event type "x"`},
				{"0190a1b2-0000-7000-8000-000000000002", "gave up after 3 attempts: timeout"},
			}
			for _, o := range old {
				exec("INSERT INTO " + n.DeadLetters + " (event_id, event_type, body, created_at, stage, consumer, reason, attempts, first_failed_at, last_failed_at)" +
					" VALUES ('" + o.id + "', 'x', '', " + now + ", 'consumer', 'c', '" + strings.ReplaceAll(o.reason, "'", "''") + "', 1, " + now + ", " + now + ")")
			}

			o, err := outboxsql.New(d.dialect, tg.Tables)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // the second run must change nothing
				if err := o.Migrate(ctx, tg.DB); err != nil {
					t.Fatal(err)
				}
			}
			table, err := o.NewDeadLetters(tg.DB)
			if err != nil {
				t.Fatal(err)
			}
			dl, err := table.List(ctx, deadletter.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(dl) != 3 {
				t.Fatalf("%d dead letters after the upgrade, want 3", len(dl))
			}
			want := []deadletter.Kind{deadletter.KindMalformed, deadletter.KindUnknownType, deadletter.KindGaveUp}
			for i, e := range dl {
				if e.Kind != want[i] || e.ID != int64(i+1) || e.Reason != old[i].reason {
					t.Errorf("dead letter %d: id %d kind %q reason %q, want id %d kind %q", i, e.ID, e.Kind, e.Reason, i+1, want[i])
				}
			}
			if dl[0].Message.ID != uuid.Nil || dl[1].Message.ID.String() != old[1].id {
				t.Errorf("event IDs after the upgrade: %s, %s", dl[0].Message.ID, dl[1].Message.ID)
			}
			if err := table.Add(ctx, deadletter.Entry{Stage: deadletter.StageConsumer, Kind: deadletter.KindMalformed,
				BrokerMessageID: "b-1", Reason: "no ID", Attempts: 1}); err != nil {
				t.Fatalf("adding an entry without an event ID: %v", err)
			}
			dl, err = table.List(ctx, deadletter.Filter{BrokerMessageID: "b-1"})
			if err != nil || len(dl) != 1 || dl[0].ID != 4 || dl[0].Message.ID != uuid.Nil {
				t.Fatalf("the new entry: %+v, %v; want ID 4 without an event ID", dl, err)
			}
		})
	}
}
