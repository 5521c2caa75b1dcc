package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/readmetest"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestREADME runs the example against PostgreSQL and Azurite and checks that it prints
// exactly what README.md says it prints.
func TestREADME(t *testing.T) {
	cfg := configFromEnv()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pgxtest.RequireServer(t, cfg.PGURL)
	outboxtest.RequireService(t, "Azure Queue Storage (Azurite)", pingAzure(ctx, cfg.AzureConn))
	outboxtest.RequireService(t, "Azure Blob Storage (Azurite)", pingBlobs(ctx, cfg.AzureBlobConn))

	var out strings.Builder
	if err := run(ctx, &out, cfg); err != nil {
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	if want := readmetest.Output(t, "README.md", "<!-- output -->"); out.String() != want {
		t.Errorf("the example's output differs from README.md's\n--- got:\n%s--- README.md:\n%s", out.String(), want)
	}
}

// pingBlobs and pingAzure list a container or a queue: the service answers.
func pingBlobs(ctx context.Context, conn string) error {
	client, err := azblob.NewClientFromConnectionString(conn, nil)
	if err != nil {
		return err
	}
	return ping(ctx, func(ctx context.Context) error {
		_, err := client.NewListContainersPager(nil).NextPage(ctx)
		return err
	})
}

func pingAzure(ctx context.Context, conn string) error {
	client, err := azqueue.NewServiceClientFromConnectionString(conn, nil)
	if err != nil {
		return err
	}
	return ping(ctx, func(ctx context.Context) error { _, err := client.NewListQueuesPager(nil).NextPage(ctx); return err })
}

func ping(ctx context.Context, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return call(ctx)
}
