package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/txoutbox/outbox/internal/readmetest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestREADME runs the example against PostgreSQL and NATS and checks that it prints exactly
// what README.md says.
func TestREADME(t *testing.T) {
	cfg := configFromEnv()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	outboxtest.RequireService(t, "PostgreSQL at "+cfg.PGURL, pingPostgres(ctx, cfg.PGURL))
	outboxtest.RequireService(t, "NATS at "+cfg.NATSURL, pingNATS(cfg.NATSURL))

	var out strings.Builder
	if err := run(ctx, &out, cfg); err != nil {
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	if want := readmetest.Output(t, "README.md", "<!-- output -->"); out.String() != want {
		t.Errorf("the example's output differs from README.md's\n--- got:\n%s--- README.md:\n%s", out.String(), want)
	}
}

func pingPostgres(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

func pingNATS(url string) error {
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		return err
	}
	nc.Close()
	return nil
}
