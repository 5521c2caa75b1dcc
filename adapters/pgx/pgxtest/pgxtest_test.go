package pgxtest_test

import (
	"context"
	"testing"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
)

type note struct {
	N int `json:"n"`
}

func (note) EventType() string { return "pgxtest.note" }

// TestNewCommitCount: a fresh, migrated schema per call; Commit writes events; Count sees
// them; the schema is gone after the test.
func TestNewCommitCount(t *testing.T) {
	var schema string
	t.Run("use", func(t *testing.T) {
		a, b := pgxtest.New(t, "pgxtest"), pgxtest.New(t, "pgxtest")
		if a.Schema == b.Schema {
			t.Fatalf("two outboxes share schema %s", a.Schema)
		}
		a.Commit(t, outbox.New(note{1}), outbox.New(note{2}))
		if n := a.Count(t, "outbox"); n != 2 {
			t.Fatalf("outbox holds %d events, want 2", n)
		}
		if n := b.Count(t, "outbox"); n != 0 {
			t.Fatalf("the other schema holds %d events, want 0", n)
		}
		schema = a.Schema
	})
	o := pgxtest.New(t, "pgxtest")
	var exists bool
	err := o.Pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists)
	if err != nil || exists {
		t.Fatalf("schema %s still exists after its test (%v)", schema, err)
	}
}
