package outboxsqs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox/outboxtest"
)

// httpTransport is shared by every test client so TestMain can close its idle connections
// before goleak looks for leaked goroutines.
var httpTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}()

func TestMain(m *testing.M) { goleak.VerifyTestMain(outboxtest.ClosingIdle(m, httpTransport)) }

// newClient returns an SQS client for the emulator with static test credentials, never the
// user's AWS environment.
func newClient() *sqs.Client { return newClientAt(outboxtest.SQSEndpoint()) }

// newClientAt returns an SQS client for the emulator at endpoint.
func newClientAt(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "outboxsqs tests"}, nil
		}),
		HTTPClient: &http.Client{Transport: httpTransport},
	})
}

// requireSQS returns a client once the emulator answers; a missing emulator fails the test
// under CI and skips it otherwise.
func requireSQS(t testing.TB) *sqs.Client {
	t.Helper()
	c := newClient()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := c.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)})
	outboxtest.RequireService(t, "SQS emulator at "+outboxtest.SQSEndpoint(), err)
	return c
}

var notName = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// uniqueName turns the test's name into an identifier with a random suffix.
func uniqueName(t testing.TB, maxLen int) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	suffix := "-" + hex.EncodeToString(b)
	name := strings.Trim(notName.ReplaceAllString(t.Name(), "-"), "-")
	if len(name) > maxLen-len(suffix) {
		name = name[len(name)-(maxLen-len(suffix)):]
	}
	return name + suffix
}

// newQueue creates a queue named after the test, deleted when the test ends.
func newQueue(t testing.TB, c *sqs.Client, fifo bool) string {
	t.Helper()
	name := "txo-" + uniqueName(t, 70)
	attrs := map[string]string{}
	if fifo {
		name += ".fifo"
		attrs[string(types.QueueAttributeNameFifoQueue)] = "true"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("creating queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl}); err != nil {
			t.Errorf("deleting queue %s: %v", name, err)
		}
	})
	return *out.QueueUrl
}
