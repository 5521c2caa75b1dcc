package claimchecks3_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox/claimcheck"
	claimchecks3 "github.com/txoutbox/outbox/claimcheck/s3"
	"github.com/txoutbox/outbox/outboxtest"
)

// httpTransport is shared by the test clients so TestMain can close its idle connections
// before goleak looks for leaked goroutines.
var httpTransport = http.DefaultTransport.(*http.Transport).Clone()

func TestMain(m *testing.M) { goleak.VerifyTestMain(outboxtest.ClosingIdle(m, httpTransport)) }

// newClient returns a client of the S3 emulator with static test credentials, never the
// user's AWS environment.
func newClient() *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(outboxtest.S3Endpoint()),
		UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "claimchecks3 tests"}, nil
		}),
		HTTPClient: &http.Client{Transport: httpTransport},
	})
}

// newBucket creates a bucket of the test's own, emptied and deleted when the test ends; a
// missing emulator fails the test under CI and skips it otherwise.
func newBucket(t *testing.T, c *s3.Client) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "txoutbox-" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)})
	outboxtest.RequireService(t, "S3 emulator at "+outboxtest.Shown(outboxtest.S3Endpoint()), err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(name)})
		if err != nil {
			t.Errorf("listing bucket %s: %v", name, err)
			return
		}
		for _, o := range out.Contents {
			if _, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(name), Key: o.Key}); err != nil {
				t.Errorf("emptying bucket %s: %v", name, err)
			}
		}
		if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(name)}); err != nil {
			t.Errorf("deleting bucket %s: %v", name, err)
		}
	})
	return name
}

func TestConformance(t *testing.T) {
	c := newClient()
	outboxtest.ExerciseBlobStore(t, func(t *testing.T) claimcheck.BlobStore {
		s, err := claimchecks3.New(c, claimchecks3.Config{Bucket: newBucket(t, c), Prefix: "txoutbox/"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestPrefixKeepsOthersOut: List and Sweep see only the blobs under Prefix.
func TestPrefixKeepsOthersOut(t *testing.T) {
	c := newClient()
	bucket := newBucket(t, c)
	ctx := context.Background()
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("other/report.pdf")}); err != nil {
		t.Fatal(err)
	}
	s, err := claimchecks3.New(c, claimchecks3.Config{Bucket: bucket, Prefix: "txoutbox/"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := claimcheck.Sweep(ctx, s, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("Sweep deleted %d, %v; want nothing outside the prefix", n, err)
	}
	if _, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("other/report.pdf")}); err != nil {
		t.Fatalf("the other object: %v", err)
	}
}

// TestMissingBucketIsNotAMissingBlob: a bucket that does not exist is the store's fault (to
// retry), not a blob-missing dead letter.
func TestMissingBucketIsNotAMissingBlob(t *testing.T) {
	c := newClient()
	_ = newBucket(t, c) // the emulator answers
	s, err := claimchecks3.New(c, claimchecks3.Config{Bucket: "txoutbox-no-such-bucket"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(context.Background(), claimcheck.Key([16]byte{1}))
	var nb *types.NoSuchBucket
	if err == nil || errors.Is(err, claimcheck.ErrNotFound) {
		t.Fatalf("Get from a missing bucket = %v (NoSuchBucket typed: %v), want an error that is not ErrNotFound", err, errors.As(err, &nb))
	}
}
