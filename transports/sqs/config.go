package outboxsqs

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/internal/config"
)

const (
	// DefaultMaxMessageBytes is the default [SenderConfig].MaxMessageBytes: 256 KiB, the SQS
	// limit for most of its history and still the limit of many SQS-compatible brokers.
	DefaultMaxMessageBytes = 256 << 10
	// MaxMessageBytesLimit is the largest message SQS accepts (1 MiB since August 2025,
	// for queues whose MaximumMessageSize allows it).
	MaxMessageBytesLimit = 1 << 20
	// DefaultMaxConcurrentCalls is the default [SenderConfig].MaxConcurrentCalls; it matches
	// the SDK HTTP client's idle connections per host, so calls reuse connections.
	DefaultMaxConcurrentCalls = 10
	// DefaultWaitTime is the default [ReceiverConfig].WaitTime, the longest long poll SQS
	// allows.
	DefaultWaitTime = 20 * time.Second

	maxVisibility = 12 * time.Hour // SQS's longest visibility timeout
	minMaxMessage = 1 << 10        // SQS's smallest MaximumMessageSize
)

// SenderConfig configures a [Sender]. Nil means the defaults, which need QueueURL or
// Routes to be set, so a nil config is always invalid.
type SenderConfig struct {
	// QueueURL receives every event whose type has no entry in Routes. It may be empty
	// when Routes is set: an event of an unrouted type then fails permanently (the relay
	// dead-letters it) instead of going to a catch-all queue. A URL ending in ".fifo" is a
	// FIFO queue.
	QueueURL string
	// Routes sends events of a type to their own queue: event type → queue URL.
	Routes map[string]string
	// Source is the CloudEvents "source" attribute of every message. Default "/txoutbox".
	Source string
	// KeylessGroupID is the MessageGroupId on FIFO queues for events without a key.
	// Default empty: each keyless event is its own group (its ID), so keyless events stay
	// unordered and are received in parallel, as the outbox promises. Set it to order all
	// keyless events in one group.
	KeylessGroupID string
	// MaxMessageBytes is the largest message the Sender sends, counted as SQS counts it
	// (body plus every attribute's name, data type and value); larger ones fail with
	// outbox.ErrTooLarge before any call. It also caps the total of one SendMessageBatch
	// call. Default [DefaultMaxMessageBytes] (256 KiB); at most [MaxMessageBytesLimit]
	// (1 MiB) and no more than your queues' MaximumMessageSize.
	MaxMessageBytes int
	// MaxConcurrentCalls bounds the SendMessageBatch calls (10 messages each) that one
	// Send has in flight. Default [DefaultMaxConcurrentCalls].
	MaxConcurrentCalls int
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *SenderConfig) WithDefaults() *SenderConfig {
	out := SenderConfig{}
	if c != nil {
		out = *c
		out.Routes = maps.Clone(c.Routes)
	}
	config.Default(&out.Source, cloudevents.DefaultSource)
	config.Default(&out.MaxMessageBytes, DefaultMaxMessageBytes)
	config.Default(&out.MaxConcurrentCalls, DefaultMaxConcurrentCalls)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *SenderConfig) validate() error {
	var errs []error
	if c.QueueURL == "" && len(c.Routes) == 0 {
		errs = append(errs, errors.New("QueueURL is empty and there are no Routes: no event has a queue"))
	}
	if c.QueueURL != "" {
		if _, err := parseQueue(c.QueueURL); err != nil {
			errs = append(errs, fmt.Errorf("QueueURL: %w", err))
		}
	}
	for _, typ := range slices.Sorted(maps.Keys(c.Routes)) {
		if typ == "" {
			errs = append(errs, errors.New("Routes has an empty event type"))
			continue
		}
		if _, err := parseQueue(c.Routes[typ]); err != nil {
			errs = append(errs, fmt.Errorf("Routes[%q]: %w", typ, err))
		}
	}
	if !validText(c.Source) {
		errs = append(errs, fmt.Errorf("Source %q has characters SQS does not accept in an attribute", c.Source))
	}
	if c.KeylessGroupID != "" && !validGroupID(c.KeylessGroupID) {
		errs = append(errs, fmt.Errorf("KeylessGroupID %q is not a valid MessageGroupId (1-128 printable ASCII characters, no spaces)", c.KeylessGroupID))
	}
	if c.MaxMessageBytes < minMaxMessage || c.MaxMessageBytes > MaxMessageBytesLimit {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is outside %d..%d", c.MaxMessageBytes, minMaxMessage, MaxMessageBytesLimit))
	}
	if c.MaxConcurrentCalls < 1 {
		errs = append(errs, fmt.Errorf("MaxConcurrentCalls %d is below 1", c.MaxConcurrentCalls))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxsqs: invalid SenderConfig: %w", errors.Join(errs...))
	}
	return nil
}

// ReceiverConfig configures a [Receiver].
type ReceiverConfig struct {
	// QueueURL is the queue to receive from. Required.
	QueueURL string
	// WaitTime is how long one Receive long-polls for a message before it returns none:
	// whole seconds from 1s to 20s. Default [DefaultWaitTime] (20s), which costs the
	// fewest requests.
	WaitTime time.Duration
	// VisibilityTimeout hides a received message from other receivers for this long; an
	// unacknowledged message reappears after it. Whole seconds up to 12h. Default 0: the
	// queue's own VisibilityTimeout (30s unless the queue sets another).
	VisibilityTimeout time.Duration
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *ReceiverConfig) WithDefaults() *ReceiverConfig {
	out := ReceiverConfig{}
	if c != nil {
		out = *c
	}
	config.Default(&out.WaitTime, DefaultWaitTime)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *ReceiverConfig) validate() error {
	var errs []error
	if c.QueueURL == "" {
		errs = append(errs, errors.New("QueueURL is empty"))
	} else if _, err := parseQueue(c.QueueURL); err != nil {
		errs = append(errs, fmt.Errorf("QueueURL: %w", err))
	}
	if c.WaitTime < time.Second || c.WaitTime > 20*time.Second || c.WaitTime%time.Second != 0 {
		errs = append(errs, fmt.Errorf("WaitTime %v is not a whole number of seconds from 1s to 20s", c.WaitTime))
	}
	if c.VisibilityTimeout < 0 || c.VisibilityTimeout > maxVisibility || c.VisibilityTimeout%time.Second != 0 {
		errs = append(errs, fmt.Errorf("VisibilityTimeout %v is not a whole number of seconds from 0 (the queue's) to 12h", c.VisibilityTimeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxsqs: invalid ReceiverConfig: %w", errors.Join(errs...))
	}
	return nil
}

// queue is one validated destination.
type queue struct {
	url  string
	name string
	fifo bool
}

// queueName is SQS's rule for queue names; FIFO names end in ".fifo" within the 80.
var queueName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}$`)

// parseQueue checks that raw is an absolute http(s) URL whose last path segment is a valid
// queue name.
func parseQueue(raw string) (*queue, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	if u.Scheme != "https" && u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)", raw)
	}
	name := u.Path[strings.LastIndexByte(u.Path, '/')+1:]
	fifo := strings.HasSuffix(name, ".fifo")
	base := strings.TrimSuffix(name, ".fifo")
	if !queueName.MatchString(base) || len(name) > 80 {
		return nil, fmt.Errorf("%q does not end in a queue name (1-80 of A-Z a-z 0-9 - _, FIFO names ending in .fifo)", raw)
	}
	return &queue{url: raw, name: name, fifo: fifo}, nil
}

// messagingSystem is SQS's messaging.system in the OpenTelemetry conventions.
const messagingSystem = "aws_sqs"
