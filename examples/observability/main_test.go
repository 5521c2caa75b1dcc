package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/readmetest"
)

// TestREADME runs the service's demo against PostgreSQL and checks that it prints exactly
// what README.md says: the one trace of the retried order and the metric lines.
func TestREADME(t *testing.T) {
	cfg := config{PGURL: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", Addr: "127.0.0.1:0", Spans: io.Discard}
	if u := os.Getenv("TXOUTBOX_PG_URL"); u != "" {
		cfg.PGURL = u
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pgxtest.RequireServer(t, cfg.PGURL)

	var out strings.Builder
	if err := run(ctx, &out, cfg); err != nil {
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	if want := readmetest.Output(t, "README.md", "<!-- output -->"); out.String() != want {
		t.Errorf("the example's output differs from README.md's\n--- got:\n%s--- README.md:\n%s", out.String(), want)
	}
}
