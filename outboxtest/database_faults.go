package outboxtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// exerciseDatabaseFaults runs the store side of "a missing schema and a database that is down are
// named as such": an outbox that was never migrated, or by an older version, fails Publish,
// the store, the dead-letter table and Relay.Run with errors wrapping outbox.ErrSchema that
// say to run Migrate (Relay.Run at once, not after retrying); a connection that the
// database drops under a statement is outbox.IsUnavailable, not the message's fault.
func exerciseDatabaseFaults(t *testing.T, newFixture func(t *testing.T) *StoreFixture) {
	ctx := context.Background()

	t.Run("UnmigratedOutboxIsNamed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if f.Unmigrate == nil {
			t.Skip("the fixture cannot unmigrate its outbox")
		}
		if err := f.Unmigrate(ctx); err != nil {
			t.Fatal(err)
		}
		expectSchemaError(t, "Publish", f.Publish(ctx, true, outbox.New(Note{Text: "nowhere"}, outbox.WithKey("k"))))
		_, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 1, Limit: 10, Lease: time.Minute})
		expectSchemaError(t, "Claim", err)
		expectSchemaError(t, "Complete", f.Store.Complete(ctx, 1, []int64{1}))
		if v, ok := f.Store.(outboxdriver.Validator); ok {
			expectSchemaError(t, "Validate", v.Validate(ctx))
		} else {
			t.Error("the store is not an outboxdriver.Validator: Relay.Run cannot check its schema first")
		}
		_, err = f.DeadLetterTable.List(ctx, deadletter.Filter{})
		expectSchemaError(t, "DeadLetterTable.List", err)
		expectSchemaError(t, "DeadLetterTable.Add", f.DeadLetterTable.Add(ctx, deadletter.Entry{
			Message: mustEncode(t, outbox.New(Note{})), Stage: deadletter.StageConsumer, Consumer: "c", Reason: "r", Attempts: 1}))
		expectRunFails(t, f)
	})

	// A table of an older version: a column this one reads is missing.
	t.Run("OldSchemaIsNamed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		needSQL(t, f.SQL)
		f.SQL.exec(t, "ALTER TABLE "+f.SQL.Outbox+" RENAME COLUMN first_failed_at TO first_failed_at_old")
		_, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 1, Limit: 10, Lease: time.Minute})
		expectSchemaError(t, "Claim", err)
		if v, ok := f.Store.(outboxdriver.Validator); ok {
			expectSchemaError(t, "Validate", v.Validate(ctx))
		}
		expectRunFails(t, f)
	})

	// The database drops the store's connection in the middle of a claim (PostgreSQL's
	// pg_terminate_backend, MySQL's KILL): the error says the database is unavailable, so
	// the relay pauses instead of counting it against anything.
	t.Run("DroppedConnectionIsUnavailable", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		needSQL(t, f.SQL)
		if f.SQL.Lock == nil {
			t.Skip("the fixture cannot drop a connection (SQLite has none)")
		}
		mustPublish(t, f, true, outbox.New(Note{Text: "waits"}, outbox.WithKey("k")))
		err := f.SQL.dropUnderLock(t, "the claim", func() error {
			_, err := f.Store.Claim(ctx, outboxdriver.ClaimParams{Owner: "t", Token: 1, Limit: 10, Lease: time.Minute})
			return err
		})
		if !outbox.IsUnavailable(err) {
			t.Fatalf("a claim whose connection was dropped: %v, want an error for which outbox.IsUnavailable is true", err)
		}
	})
}

// dropUnderLock runs call while the outbox table is locked (Lock), waits for its statement
// to wait for the lock, drops its connection (KillWaiting) and returns call's error.
func (s *RawSQL) dropUnderLock(t *testing.T, what string, call func() error) error {
	t.Helper()
	ctx := context.Background()
	unlock, err := s.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	done := make(chan error, 1)
	go func() { done <- call() }()
	WaitFor(t, 30*time.Second, what+" to wait for the lock, and its connection to be dropped", func() bool {
		n, err := s.KillWaiting(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return within 30s of its connection being dropped", what)
	}
	return err
}

// expectSchemaError fails unless err wraps outbox.ErrSchema and says to run Migrate.
func expectSchemaError(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, outbox.ErrSchema) || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("%s on an outbox that is not migrated: %v, want an error wrapping outbox.ErrSchema that says to run Migrate", what, err)
	}
}

// expectRunFails runs a relay over f's store: it must return an ErrSchema error at once,
// instead of retrying for as long as it runs (bounded here by 30s, after which Run would
// return nil).
func expectRunFails(t *testing.T, f *StoreFixture) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newRelay(t, f.Store, outboxmemory.New(nil), fastRelay("unmigrated", 10))
	expectSchemaError(t, "Relay.Run", r.Run(ctx))
}
