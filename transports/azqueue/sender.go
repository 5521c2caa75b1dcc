package outboxazqueue

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2/queueerror"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/internal/config"
)

// SenderConfig configures a [Sender]. DefaultQueue or Routes must be set; every other field
// has a default.
type SenderConfig struct {
	// DefaultQueue receives the events whose type is not in Routes. When it is empty, an
	// event of an unrouted type fails with [ErrNoRoute] and is dead-lettered by the relay.
	DefaultQueue string
	// Routes maps an event type ("files.parse_requested") to the queue that receives it.
	Routes map[string]string
	// Concurrency bounds how many messages one Send puts in flight at once: the service
	// takes one message per request, so a batch is sent concurrently. Default 10, the
	// number of idle connections the Azure SDK's default HTTP transport keeps per host;
	// raising it pays off only with a transport that keeps as many.
	Concurrency int
	// TimeToLive is how long an unreceived message stays in its queue, in whole seconds
	// (at least 1s). Default: forever, so a consumer outage never silently drops events
	// (the service's own default would drop them after 7 days).
	TimeToLive time.Duration
	// Encoding is how the CloudEvent document is written in the message text. Default
	// [Base64].
	Encoding Encoding
	// Source is the CloudEvents source attribute. Default "/txoutbox".
	Source string
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *SenderConfig) WithDefaults() *SenderConfig {
	out := SenderConfig{}
	if c != nil {
		out = *c
		out.Routes = maps.Clone(c.Routes)
	}
	config.Default(&out.Concurrency, 10)
	config.Default(&out.Source, cloudevents.DefaultSource)
	return &out
}

func (c *SenderConfig) validate() error {
	var errs []error
	if c.DefaultQueue == "" && len(c.Routes) == 0 {
		errs = append(errs, errors.New("neither DefaultQueue nor Routes is set: no event has a queue"))
	}
	if c.DefaultQueue != "" {
		if err := checkQueueName(c.DefaultQueue); err != nil {
			errs = append(errs, fmt.Errorf("DefaultQueue: %w", err))
		}
	}
	for _, typ := range slices.Sorted(maps.Keys(c.Routes)) {
		if typ == "" {
			errs = append(errs, errors.New("Routes has an empty event type"))
		}
		if err := checkQueueName(c.Routes[typ]); err != nil {
			errs = append(errs, fmt.Errorf("Routes[%q]: %w", typ, err))
		}
	}
	if c.Concurrency < 1 || c.Concurrency > 1000 {
		errs = append(errs, fmt.Errorf("Concurrency %d is outside 1..1000", c.Concurrency))
	}
	if c.TimeToLive < 0 || (c.TimeToLive > 0 && c.TimeToLive < time.Second) {
		errs = append(errs, fmt.Errorf("TimeToLive %v must be 0 (forever) or at least 1s", c.TimeToLive))
	}
	if !c.Encoding.valid() {
		errs = append(errs, fmt.Errorf("Encoding %v is neither Base64 nor Text", c.Encoding))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxazqueue: invalid SenderConfig: %w", errors.Join(errs...))
	}
	return nil
}

// Sender delivers the relay's messages to Azure Queue Storage: each message becomes one
// queue message in the queue its event type routes to. It is safe for concurrent use.
type Sender struct {
	cfg    *SenderConfig
	queues map[string]*azqueue.QueueClient // by queue name: every queue a route names
	enq    *azqueue.EnqueueMessageOptions
}

// NewSender returns a sender over client (from azqueue.NewServiceClient,
// NewServiceClientFromConnectionString…). The configuration is checked here, every problem
// reported at once. The queues must exist; [Sender.CreateQueues] creates them.
func NewSender(client *azqueue.ServiceClient, cfg *SenderConfig) (*Sender, error) {
	c := cfg.WithDefaults()
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("outboxazqueue: NewSender needs an *azqueue.ServiceClient"))
	}
	if err := c.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s := &Sender{cfg: c, queues: map[string]*azqueue.QueueClient{}}
	for _, name := range s.queueNames() {
		s.queues[name] = client.NewQueueClient(name)
	}
	ttl := int32(-1) // never expires
	if c.TimeToLive > 0 {
		ttl = int32(min(c.TimeToLive/time.Second, 1<<31-1))
	}
	s.enq = &azqueue.EnqueueMessageOptions{TimeToLive: &ttl}
	return s, nil
}

// queueNames returns every queue the routes name, sorted.
func (s *Sender) queueNames() []string {
	names := slices.Collect(maps.Values(s.cfg.Routes))
	if s.cfg.DefaultQueue != "" {
		names = append(names, s.cfg.DefaultQueue)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// MaxMessageBytes returns the largest CloudEvent document (envelope and payload) the sender
// accepts: what fits the service's 64 KiB once encoded, 48 KiB with Base64.
func (s *Sender) MaxMessageBytes() int { return s.cfg.Encoding.maxDocBytes() }

// CreateQueues creates every queue the configuration names that does not exist yet. Call it
// at start-up if the application, not its infrastructure code, owns the queues.
func (s *Sender) CreateQueues(ctx context.Context) error {
	var errs []error
	for _, name := range s.queueNames() {
		_, err := s.queues[name].Create(ctx, nil)
		if err != nil && !queueerror.HasCode(err, queueerror.QueueAlreadyExists) {
			errs = append(errs, fmt.Errorf("outboxazqueue: creating queue %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Send puts each message in its queue, up to Concurrency at a time. It returns nil when all
// were accepted, or an [*outbox.BatchError] naming the ones that failed. Messages that can
// never be sent (over the 64 KiB limit, no route) fail before any request is made, with
// permanent errors (the first wraps [outbox.ErrTooLarge]), so the relay dead-letters them
// and the rest of the batch is delivered. Failures that are the service's or the
// connection's are marked outbox.Unavailable (see the package's Outages section).
func (s *Sender) Send(ctx context.Context, msgs []outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	type job struct {
		index int
		queue string
		text  string
	}
	failed := map[int]error{}
	jobs := make([]job, 0, len(msgs))
	for i, m := range msgs {
		queue, err := s.route(m)
		if err == nil {
			var text string
			if text, err = encode(m, s.cfg.Source, s.cfg.Encoding); err == nil {
				jobs = append(jobs, job{index: i, queue: queue, text: text})
				continue
			}
		}
		failed[i] = err
	}

	errs := make([]error, len(jobs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(s.cfg.Concurrency, len(jobs)) {
		wg.Go(func() {
			for j := int(next.Add(1) - 1); j < len(jobs); j = int(next.Add(1) - 1) {
				jb := jobs[j]
				errs[j] = s.enqueue(ctx, msgs[jb.index], jb.queue, jb.text)
			}
		})
	}
	wg.Wait()
	for j, err := range errs {
		if err != nil {
			failed[jobs[j].index] = markBrokerFault(err)
		}
	}
	if len(failed) > 0 {
		return &outbox.BatchError{Failed: failed}
	}
	return nil
}

// Ping reads the properties of a queue the Sender sends to (DefaultQueue, else the first
// queue the Routes name, by name), sending nothing ([outbox.Pinger]): the relay calls it
// to learn that the service is back when it has nothing to send. It fails as a Send would,
// marked outbox.Unavailable for the service's faults: no answer before ctx's deadline, a
// 5xx or 429, authentication, a queue that does not exist.
func (s *Sender) Ping(ctx context.Context) error {
	name := s.cfg.DefaultQueue
	if name == "" {
		name = s.queueNames()[0] // validated: DefaultQueue or Routes is set
	}
	if _, err := s.queues[name].GetProperties(ctx, nil); err != nil {
		if queueerror.HasCode(err, queueerror.QueueNotFound) {
			err = fmt.Errorf("queue %q does not exist (create it, or call Sender.CreateQueues): %w", name, err)
		} else {
			err = fmt.Errorf("queue %q: %w", name, err)
		}
		return markBrokerFault(fmt.Errorf("outboxazqueue: pinging %w", err))
	}
	return nil
}

func (s *Sender) route(m outbox.Message) (string, error) {
	if q, ok := s.cfg.Routes[m.Type]; ok {
		return q, nil
	}
	if s.cfg.DefaultQueue != "" {
		return s.cfg.DefaultQueue, nil
	}
	return "", outbox.Permanent(fmt.Errorf("%w %q (message %s): add it to SenderConfig.Routes or set DefaultQueue", ErrNoRoute, m.Type, m.ID))
}

func (s *Sender) enqueue(ctx context.Context, m outbox.Message, queue, text string) error {
	if err := ctx.Err(); err != nil { // cancelled mid-batch: do not start more requests
		return fmt.Errorf("outboxazqueue: message %s not sent to queue %q: %w", m.ID, queue, err)
	}
	_, err := s.queues[queue].EnqueueMessage(ctx, text, s.enq)
	switch {
	case err == nil:
		return nil
	case queueerror.HasCode(err, queueerror.QueueNotFound):
		// Not the message's fault: the relay waits for the queue (isBrokerFault).
		return fmt.Errorf("outboxazqueue: sending message %s: queue %q does not exist (create it, or call Sender.CreateQueues): %w", m.ID, queue, err)
	case queueerror.HasCode(err, queueerror.RequestBodyTooLarge, queueerror.MessageTooLarge):
		// The size check before sending should make this unreachable; keep it permanent.
		return fmt.Errorf("outboxazqueue: message %s rejected by queue %q as too large (%d bytes of text): %w: %w", m.ID, queue, len(text), outbox.ErrTooLarge, err)
	}
	return fmt.Errorf("outboxazqueue: sending message %s to queue %q: %w", m.ID, queue, err)
}

var (
	_ outbox.Sender = (*Sender)(nil)
	_ outbox.Pinger = (*Sender)(nil)
)

// MessagingSystem returns "azure_queue_storage", for telemetry ([outbox.Describer]; the
// OpenTelemetry conventions name no value for Queue Storage).
func (s *Sender) MessagingSystem() string { return messagingSystem }

// DestinationName returns the queue m is sent to ("" when it has no route).
func (s *Sender) DestinationName(m outbox.Message) string {
	if q, ok := s.cfg.Routes[m.Type]; ok {
		return q
	}
	return s.cfg.DefaultQueue
}
