package main

import (
	"context"
	"strings"
	"testing"

	"github.com/txoutbox/outbox/internal/readmetest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestREADME runs the example as README.md's command does (embedded SQLite, in-process
// Kafka) and checks that it prints exactly what README.md says; then the same on
// PostgreSQL.
func TestREADME(t *testing.T) {
	want := readmetest.Output(t, "README.md", "<!-- output -->")
	var out strings.Builder
	if err := run(&out, "sqlite", "", ""); err != nil {
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	if out.String() != want {
		t.Errorf("the example's output differs from README.md's\n--- got:\n%s--- README.md:\n%s", out.String(), want)
	}

	t.Run("postgres", func(t *testing.T) {
		db, _, cleanup, err := open(context.Background(), "postgres", "")
		if err == nil {
			err = db.PingContext(context.Background())
		}
		cleanup()
		outboxtest.RequireService(t, "PostgreSQL", err)
		var out strings.Builder
		if err := run(&out, "postgres", "", ""); err != nil {
			t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
		}
		_, gotRest, _ := strings.Cut(out.String(), "\n")
		_, wantRest, _ := strings.Cut(want, "\n")
		if gotRest != wantRest {
			t.Errorf("on PostgreSQL the example printed:\n%s", out.String())
		}
	})
}
