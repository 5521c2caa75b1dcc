package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/txoutbox/outbox/internal/readmetest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestPrintsWhatTheREADMESays runs the README's first command's program on embedded
// SQLite, and the same on PostgreSQL and MySQL.
func TestPrintsWhatTheREADMESays(t *testing.T) {
	want := readmetest.Output(t, "../../README.md", "<!-- quickstart output -->")
	if own := readmetest.Output(t, "README.md", "<!-- output -->"); own != want {
		t.Fatalf("examples/quickstart/README.md shows:\n%s\nthe repository's README:\n%s", own, want)
	}
	var out bytes.Buffer
	if err := run(&out, "sqlite", ""); err != nil {
		t.Fatal(err)
	}
	if out.String() != want {
		t.Fatalf("quickstart printed:\n%s\nREADME says:\n%s", out.String(), want)
	}
	for _, kind := range []string{"postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			db, _, cleanup, err := open(context.Background(), kind, "")
			if err == nil {
				err = db.PingContext(context.Background())
			}
			cleanup()
			outboxtest.RequireService(t, kind, err)
			var out bytes.Buffer
			if err := run(&out, kind, ""); err != nil {
				t.Fatal(err)
			}
			_, gotRest, _ := strings.Cut(out.String(), "\n")
			_, wantRest, _ := strings.Cut(want, "\n")
			if gotRest != wantRest {
				t.Fatalf("on %s the quickstart printed:\n%s", kind, out.String())
			}
		})
	}
}
