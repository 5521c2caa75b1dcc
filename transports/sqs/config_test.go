package outboxsqs_test

import (
	"strings"
	"testing"

	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

func TestNewSenderReportsEveryProblem(t *testing.T) {
	_, err := outboxsqs.NewSender(nil, &outboxsqs.SenderConfig{
		QueueURL:           "sqs.us-east-1.amazonaws.com/123/orders",
		Routes:             map[string]string{"": "https://x/1/a", "files.parsed": "https://sqs/123/bad name"},
		Source:             "/app\x00",
		KeylessGroupID:     "has space",
		MaxMessageBytes:    2 << 20,
		MaxConcurrentCalls: -1,
	})
	if err == nil {
		t.Fatal("NewSender accepted an invalid config")
	}
	t.Log(err)
	for _, want := range []string{
		"needs a client",
		`QueueURL: "sqs.us-east-1.amazonaws.com/123/orders" is not an http(s) queue URL`,
		"Routes has an empty event type",
		`Routes["files.parsed"]`,
		"Source",
		"KeylessGroupID",
		"MaxMessageBytes 2097152 is outside 1024..1048576",
		"MaxConcurrentCalls -1",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestNewSenderNeedsADestination(t *testing.T) {
	if _, err := outboxsqs.NewSender(newClient(), nil); err == nil || !strings.Contains(err.Error(), "no Routes") {
		t.Fatalf("NewSender(nil config) = %v, want an error about the missing queue", err)
	}
}

func TestSenderDefaults(t *testing.T) {
	c := (*outboxsqs.SenderConfig)(nil).WithDefaults()
	if c.Source != "/txoutbox" || c.MaxMessageBytes != 256<<10 || c.MaxConcurrentCalls != 10 || c.KeylessGroupID != "" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestNewReceiverReportsEveryProblem(t *testing.T) {
	_, err := outboxsqs.NewReceiver(nil, &outboxsqs.ReceiverConfig{WaitTime: 1500 * 1e6, VisibilityTimeout: -1})
	if err == nil {
		t.Fatal("NewReceiver accepted an invalid config")
	}
	for _, want := range []string{"needs a client", "QueueURL is empty", "WaitTime 1.5s", "VisibilityTimeout -1ns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	c := (*outboxsqs.ReceiverConfig)(nil).WithDefaults()
	if c.WaitTime != outboxsqs.DefaultWaitTime || c.VisibilityTimeout != 0 {
		t.Fatalf("defaults %+v", c)
	}
}
