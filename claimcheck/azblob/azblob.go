// Package claimcheckazblob is a claimcheck.BlobStore in an Azure Blob Storage container
// (or Azurite's), through the azblob SDK. It is for applications that claim-check their
// events' bodies in Azure, typically those on Azure Queue Storage and its 64 KiB limit; the
// container is created and configured by you.
//
// Blobs are named Prefix + key; references are their URLs. In production, remove them by
// age with a lifecycle management rule on Prefix (delete after N days since modification,
// see docs/claimcheck.md) instead of claimcheck.Sweep, which this store supports as well.
package claimcheckazblob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/claimcheck"
)

// Config configures a [Store].
type Config struct {
	// Prefix starts every blob name, so that one container can serve other things and a
	// lifecycle rule can target the blobs alone (e.g. "txoutbox/"): letters, digits, "-",
	// "_", "." and "/". Optional.
	Prefix string
}

// Store is a claimcheck.BlobStore in one container.
type Store struct {
	c      *container.Client
	prefix string
	ref    string
}

var _ claimcheck.BlobStore = (*Store)(nil)

// New returns the store in the container of c (container.NewClientFromConnectionString,
// or a client with an Entra ID credential).
func New(c *container.Client, cfg Config) (*Store, error) {
	var errs []error
	if c == nil {
		errs = append(errs, errors.New("New needs a *container.Client"))
	}
	for i, r := range cfg.Prefix {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./", r)) {
			errs = append(errs, fmt.Errorf("Config.Prefix %q: character %d (%q) is not a letter, a digit, '-', '_', '.' or '/'", cfg.Prefix, i, r))
			break
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("claimcheckazblob: %w", errors.Join(errs...))
	}
	return &Store{c: c, prefix: cfg.Prefix, ref: strings.TrimSuffix(c.URL(), "/") + "/" + cfg.Prefix}, nil
}

// Put implements claimcheck.BlobStore.
func (s *Store) Put(ctx context.Context, key string, body []byte) error {
	if err := claimcheck.ValidKey(key); err != nil {
		return err
	}
	if _, err := s.c.NewBlockBlobClient(s.prefix+key).UploadBuffer(ctx, body, nil); err != nil {
		return s.fail("writing", key, err)
	}
	return nil
}

// Get implements claimcheck.BlobStore.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := claimcheck.ValidKey(key); err != nil {
		return nil, err
	}
	resp, err := s.c.NewBlockBlobClient(s.prefix+key).DownloadStream(ctx, nil)
	if err != nil {
		return nil, s.fail("reading", key, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, s.fail("reading", key, err)
	}
	return b, nil
}

// Delete implements claimcheck.BlobStore.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := claimcheck.ValidKey(key); err != nil {
		return err
	}
	_, err := s.c.NewBlockBlobClient(s.prefix+key).Delete(ctx, nil)
	if err != nil && !bloberror.HasCode(err, bloberror.BlobNotFound) {
		return s.fail("deleting", key, err)
	}
	return nil
}

// List implements claimcheck.BlobStore: the blobs under Prefix, with their Last-Modified.
func (s *Store) List(ctx context.Context, yield func(claimcheck.Blob) bool) error {
	pager := s.c.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &s.prefix})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return outbox.Unavailable(fmt.Errorf("claimcheckazblob: listing %s: %w", s.ref, err))
		}
		for _, b := range page.Segment.BlobItems {
			if b.Name == nil || b.Properties == nil || b.Properties.LastModified == nil {
				continue
			}
			key := strings.TrimPrefix(*b.Name, s.prefix)
			if claimcheck.ValidKey(key) != nil {
				continue // not a blob of ours
			}
			blob := claimcheck.Blob{Key: key, Modified: *b.Properties.LastModified}
			if b.Properties.ContentLength != nil {
				blob.Size = *b.Properties.ContentLength
			}
			if !yield(blob) {
				return nil
			}
		}
	}
	return nil
}

// Ref implements claimcheck.BlobStore: the blob's URL.
func (s *Store) Ref(key string) string { return s.ref + key }

// fail names the blob; a missing one wraps claimcheck.ErrNotFound.
func (s *Store) fail(doing, key string, err error) error {
	if bloberror.HasCode(err, bloberror.BlobNotFound) {
		return fmt.Errorf("%w: %s", claimcheck.ErrNotFound, s.Ref(key))
	}
	return fmt.Errorf("claimcheckazblob: %s %s: %w", doing, s.Ref(key), err)
}
