package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox/internal/readmetest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestREADME runs the example against PostgreSQL and NATS and checks that it prints exactly
// what README.md says.
func TestREADME(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	err := run(ctx, &out, configFromEnv())
	if down := (*unreachable)(nil); errors.As(err, &down) {
		outboxtest.RequireService(t, down.service, down.err)
	}
	if err != nil {
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	if want := readmetest.Output(t, "README.md", "<!-- output -->"); out.String() != want {
		t.Errorf("the example's output differs from README.md's\n--- got:\n%s--- README.md:\n%s", out.String(), want)
	}
}
