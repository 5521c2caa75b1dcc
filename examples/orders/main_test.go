package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/readmetest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestREADME runs the example against PostgreSQL and the SQS emulator and checks that it
// prints exactly what README.md says it prints.
func TestREADME(t *testing.T) {
	cfg := configFromEnv()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pgxtest.RequireServer(t, cfg.PGURL)
	outboxtest.RequireService(t, "SQS at "+cfg.SQSEndpoint, pingSQS(ctx, cfg.SQSEndpoint))

	var out strings.Builder
	if err := run(ctx, &out, cfg); err != nil {
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	if want := readmetest.Output(t, "README.md", "<!-- output -->"); out.String() != want {
		t.Errorf("the example's output differs from README.md's\n--- got:\n%s--- README.md:\n%s", out.String(), want)
	}
}

func pingSQS(ctx context.Context, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := newSQSClient(endpoint).ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)})
	return err
}
