// Package claimchecks3 is a claimcheck.BlobStore in an Amazon S3 bucket (or any S3-compatible
// store: MinIO, moto, Ceph), through aws-sdk-go-v2's service/s3. It is for applications that
// claim-check their events' bodies in S3; the bucket is created and configured by you.
//
// Objects are named Prefix + key; references are s3://bucket/Prefix+key. In production,
// remove them by age with a lifecycle rule on Prefix (Expiration in days, see
// docs/claimcheck.md) instead of claimcheck.Sweep, which this store supports as well.
package claimchecks3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/claimcheck"
)

// Config configures a [Store].
type Config struct {
	// Bucket holds the blobs. Required; it must exist.
	Bucket string
	// Prefix starts every object name, so that one bucket can serve other things and a
	// lifecycle rule can target the blobs alone (e.g. "txoutbox/"). Optional.
	Prefix string
}

// Store is a claimcheck.BlobStore in one S3 bucket.
type Store struct {
	client *s3.Client
	cfg    Config
}

var _ claimcheck.BlobStore = (*Store)(nil)

// New returns the store over client (configured with the region, credentials and, for an
// emulator, the endpoint and path-style addressing).
func New(client *s3.Client, cfg Config) (*Store, error) {
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("New needs an *s3.Client"))
	}
	if cfg.Bucket == "" {
		errs = append(errs, errors.New("Config.Bucket is required"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("claimchecks3: %w", errors.Join(errs...))
	}
	return &Store{client: client, cfg: cfg}, nil
}

// Put implements claimcheck.BlobStore.
func (s *Store) Put(ctx context.Context, key string, body []byte) error {
	if err := claimcheck.ValidKey(key); err != nil {
		return err
	}
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.cfg.Prefix + key),
		Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
	})
	if err != nil {
		return s.fail("writing", key, err)
	}
	return nil
}

// Get implements claimcheck.BlobStore.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := claimcheck.ValidKey(key); err != nil {
		return nil, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.cfg.Prefix + key)})
	if err != nil {
		return nil, s.fail("reading", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, s.fail("reading", key, err)
	}
	return b, nil
}

// Delete implements claimcheck.BlobStore; S3 answers a missing object's delete with success.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := claimcheck.ValidKey(key); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.cfg.Prefix + key)})
	if err != nil && !notFound(err) {
		return s.fail("deleting", key, err)
	}
	return nil
}

// List implements claimcheck.BlobStore: the objects under Prefix, with their LastModified.
func (s *Store) List(ctx context.Context, yield func(claimcheck.Blob) bool) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(s.cfg.Prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return outbox.Unavailable(fmt.Errorf("claimchecks3: listing bucket %s: %w", s.cfg.Bucket, err))
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)[len(s.cfg.Prefix):]
			if claimcheck.ValidKey(key) != nil {
				continue // not a blob of ours
			}
			if !yield(claimcheck.Blob{Key: key, Size: aws.ToInt64(o.Size), Modified: aws.ToTime(o.LastModified)}) {
				return nil
			}
		}
	}
	return nil
}

// Ref implements claimcheck.BlobStore: s3://bucket/prefix+key.
func (s *Store) Ref(key string) string { return "s3://" + s.cfg.Bucket + "/" + s.cfg.Prefix + key }

// fail names the object; a missing one wraps claimcheck.ErrNotFound.
func (s *Store) fail(doing, key string, err error) error {
	if notFound(err) {
		return fmt.Errorf("%w: %s", claimcheck.ErrNotFound, s.Ref(key))
	}
	return fmt.Errorf("claimchecks3: %s %s: %w", doing, s.Ref(key), err)
}

// notFound reports whether err says the object (not the bucket) does not exist.
func notFound(err error) bool {
	var nsk *types.NoSuchKey
	if errors.As(err, &nsk) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) && (api.ErrorCode() == "NoSuchKey" || api.ErrorCode() == "NotFound") {
		return true
	}
	var resp interface{ HTTPStatusCode() int }
	if errors.As(err, &resp) && resp.HTTPStatusCode() == http.StatusNotFound {
		var apiErr smithy.APIError
		return !errors.As(err, &apiErr) || apiErr.ErrorCode() != "NoSuchBucket"
	}
	return false
}
