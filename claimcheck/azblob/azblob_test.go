package claimcheckazblob_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox/claimcheck"
	claimcheckazblob "github.com/txoutbox/outbox/claimcheck/azblob"
	"github.com/txoutbox/outbox/outboxtest"
)

// transport is shared by the test clients so TestMain can close its idle connections
// before goleak looks for leaked goroutines.
var transport = &http.Transport{MaxIdleConnsPerHost: 16}

func TestMain(m *testing.M) { goleak.VerifyTestMain(outboxtest.ClosingIdle(m, transport)) }

// client returns the client of a container in Azurite's blob service.
func client(t *testing.T, name string) *container.Client {
	t.Helper()
	c, err := container.NewClientFromConnectionString(outboxtest.AzuriteBlobConnString(), name,
		&container.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: &http.Client{Transport: transport}}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newContainer creates a container of the test's own in Azurite's blob service, deleted
// when the test ends; a missing Azurite fails the test under CI and skips it otherwise.
func newContainer(t *testing.T) *container.Client {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "txoutbox-" + hex.EncodeToString(b)
	c := client(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Create(ctx, nil)
	outboxtest.RequireService(t, "Azurite's blob service", err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Delete(ctx, nil); err != nil {
			t.Errorf("deleting container %s: %v", name, err)
		}
	})
	return c
}

func TestConformance(t *testing.T) {
	outboxtest.ExerciseBlobStore(t, func(t *testing.T) claimcheck.BlobStore {
		s, err := claimcheckazblob.New(newContainer(t), claimcheckazblob.Config{Prefix: "txoutbox/"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestPrefixKeepsOthersOut: List and Sweep see only the blobs under Prefix.
func TestPrefixKeepsOthersOut(t *testing.T) {
	c := newContainer(t)
	ctx := context.Background()
	if _, err := c.NewBlockBlobClient("other/report.pdf").UploadBuffer(ctx, []byte("pdf"), nil); err != nil {
		t.Fatal(err)
	}
	s, err := claimcheckazblob.New(c, claimcheckazblob.Config{Prefix: "txoutbox/"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := claimcheck.Sweep(ctx, s, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("Sweep deleted %d, %v; want nothing outside the prefix", n, err)
	}
	if _, err := c.NewBlobClient("other/report.pdf").GetProperties(ctx, nil); err != nil {
		t.Fatalf("the other blob: %v", err)
	}
}

// TestMissingContainerIsNotAMissingBlob: a container that does not exist is the store's
// fault (to retry), not a blob-missing dead letter.
func TestMissingContainerIsNotAMissingBlob(t *testing.T) {
	_ = newContainer(t) // Azurite answers
	s, err := claimcheckazblob.New(client(t, "txoutbox-no-such-container"), claimcheckazblob.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), claimcheck.Key([16]byte{1})); err == nil || errors.Is(err, claimcheck.ErrNotFound) {
		t.Fatalf("Get from a missing container = %v, want an error that is not ErrNotFound", err)
	}
}

func TestPrefixValidated(t *testing.T) {
	if _, err := claimcheckazblob.New(client(t, "x"), claimcheckazblob.Config{Prefix: "a b"}); err == nil {
		t.Fatal(`New with Prefix "a b" succeeded`)
	}
}
