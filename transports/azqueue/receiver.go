package outboxazqueue

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2/queueerror"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/config"
)

// maxDequeue is the most messages one Get Messages request returns.
const maxDequeue = 32

// maxVisibility is the longest visibility timeout the service accepts: 7 days.
const maxVisibility = 7 * 24 * time.Hour

// ReceiverConfig configures a [Receiver]; nil means the defaults below.
type ReceiverConfig struct {
	// VisibilityTimeout is how long a received message stays hidden from other receivers
	// while it is handled, in whole seconds (1s to 7 days). A message not acknowledged in
	// time is received again. Default 30s.
	VisibilityTimeout time.Duration
	// MinPollInterval is the wait after a request that found the queue empty; each further
	// empty request doubles it, up to MaxPollInterval, and any message resets it. The
	// service has no long poll, so this trades latency for requests (each one is billed):
	// the defaults, 50ms and 2s, give sub-second latency while messages flow and one
	// request every 2s per idle receiver.
	MinPollInterval time.Duration
	MaxPollInterval time.Duration
	// WaitTime is how long one Receive polls an empty queue before it returns no messages,
	// like a long poll. Default 20s.
	WaitTime time.Duration
	// RequestTimeout bounds each Get Messages request, so a connection that stopped
	// answering fails the Receive instead of hanging it until ctx ends. Default 30s.
	RequestTimeout time.Duration
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *ReceiverConfig) WithDefaults() *ReceiverConfig {
	out := ReceiverConfig{}
	if c != nil {
		out = *c
	}
	config.Default(&out.VisibilityTimeout, 30*time.Second)
	config.Default(&out.MinPollInterval, 50*time.Millisecond)
	config.Default(&out.MaxPollInterval, 2*time.Second)
	config.Default(&out.WaitTime, 20*time.Second)
	config.Default(&out.RequestTimeout, 30*time.Second)
	return &out
}

func (c *ReceiverConfig) validate() error {
	var errs []error
	if c.VisibilityTimeout < time.Second || c.VisibilityTimeout > maxVisibility {
		errs = append(errs, fmt.Errorf("VisibilityTimeout %v is outside 1s..168h (the service's range)", c.VisibilityTimeout))
	}
	if c.MinPollInterval <= 0 || c.MaxPollInterval < c.MinPollInterval {
		errs = append(errs, fmt.Errorf("poll intervals must satisfy 0 < MinPollInterval (%v) <= MaxPollInterval (%v)", c.MinPollInterval, c.MaxPollInterval))
	}
	if c.WaitTime <= 0 {
		errs = append(errs, fmt.Errorf("WaitTime %v is not positive", c.WaitTime))
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("RequestTimeout %v is not positive", c.RequestTimeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxazqueue: invalid ReceiverConfig: %w", errors.Join(errs...))
	}
	return nil
}

// Receiver reads one queue for a consumer. It is safe for concurrent use.
type Receiver struct {
	client *azqueue.QueueClient
	queue  string
	cfg    *ReceiverConfig
	vis    int32 // VisibilityTimeout in seconds

	mu   sync.Mutex
	idle time.Duration // next wait on an empty queue
}

// NewReceiver returns a receiver of the queue client points at (from
// azqueue.NewQueueClientFromConnectionString, ServiceClient.NewQueueClient…). The
// configuration is checked here, every problem reported at once.
func NewReceiver(client *azqueue.QueueClient, cfg *ReceiverConfig) (*Receiver, error) {
	c := cfg.WithDefaults()
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("outboxazqueue: NewReceiver needs an *azqueue.QueueClient"))
	}
	if err := c.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Receiver{
		client: client,
		queue:  queueOf(client),
		cfg:    c,
		vis:    ceilSeconds(c.VisibilityTimeout),
		idle:   c.MinPollInterval,
	}, nil
}

// queueOf returns the queue name in client's URL, for error messages.
func queueOf(client *azqueue.QueueClient) string {
	if u, err := url.Parse(client.URL()); err == nil {
		return path.Base(u.Path)
	}
	return client.URL()
}

// Receive returns up to limit messages (more than 32 takes several requests). When the queue
// is empty it polls (see MinPollInterval) until a message arrives, WaitTime passes (it then
// returns none) or ctx ends (it then returns ctx's error).
func (r *Receiver) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	limit = max(limit, 1)
	deadline := time.Now().Add(r.cfg.WaitTime)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ds, err := r.dequeue(ctx, limit)
		if ctx.Err() != nil {
			// Messages taken as ctx ended become visible again after VisibilityTimeout.
			return nil, ctx.Err()
		}
		if len(ds) > 0 {
			r.setIdle(r.cfg.MinPollInterval)
			return ds, nil // a later request's error, if any, shows again on the next call
		}
		if err != nil {
			return nil, err
		}
		wait := r.nextIdle()
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// dequeue takes up to limit visible messages, 32 per request, while requests come back full.
func (r *Receiver) dequeue(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	var out []outbox.Delivery
	for len(out) < limit {
		n := int32(min(limit-len(out), maxDequeue))
		rctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
		resp, err := r.client.DequeueMessages(rctx, &azqueue.DequeueMessagesOptions{NumberOfMessages: &n, VisibilityTimeout: &r.vis})
		cancel()
		if err != nil {
			if queueerror.HasCode(err, queueerror.QueueNotFound) {
				return out, markBrokerFault(fmt.Errorf("outboxazqueue: receiving: queue %q does not exist: %w", r.queue, err))
			}
			return out, markBrokerFault(fmt.Errorf("outboxazqueue: receiving from queue %q: %w", r.queue, err))
		}
		for _, m := range resp.Messages {
			out = append(out, r.delivery(m))
		}
		if len(resp.Messages) < int(n) {
			break
		}
	}
	return out, nil
}

func (r *Receiver) delivery(m *azqueue.DequeuedMessage) *delivery {
	d := &delivery{r: r}
	if m.MessageID != nil {
		d.id = *m.MessageID
	}
	if m.PopReceipt != nil {
		d.receipt = *m.PopReceipt
	}
	if m.DequeueCount != nil {
		d.attempt = int(*m.DequeueCount)
	}
	if m.MessageText != nil {
		d.text = []byte(*m.MessageText) // the one copy: a malformed message's error shares it
	}
	d.msg, d.err = decode(d.id, d.text)
	var me *outbox.MalformedError
	if errors.As(d.err, &me) {
		me.Err = fmt.Errorf("outboxazqueue: queue %q: %w", r.queue, me.Err)
	}
	return d
}

func (r *Receiver) setIdle(d time.Duration) {
	r.mu.Lock()
	r.idle = d
	r.mu.Unlock()
}

// nextIdle returns the wait before the next poll of an empty queue and doubles the one after.
func (r *Receiver) nextIdle() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	wait := r.idle
	r.idle = min(r.idle*2, r.cfg.MaxPollInterval)
	return wait
}

// delivery is one dequeued message. Its pop receipt changes with every Nack.
type delivery struct {
	r       *Receiver
	id      string // the service's message ID (not the event ID)
	text    []byte // as received: Nack writes it back unchanged
	attempt int
	msg     outbox.Message
	err     error

	mu      sync.Mutex
	receipt string
	acked   bool
}

// Message returns the decoded event, or an *outbox.MalformedError for a queue message that
// is not a CloudEvent, keeping the service's message ID and the text as received (the
// delivery can still be acked).
func (d *delivery) Message() (outbox.Message, error) { return d.msg, d.err }

// Attempt is the message's DequeueCount: 1 on its first delivery.
func (d *delivery) Attempt() int { return d.attempt }

// Ack deletes the message. A message already gone (deleted by a receiver that got it after
// this one's visibility timeout) counts as acknowledged.
func (d *delivery) Ack(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.acked {
		return nil
	}
	_, err := d.r.client.DeleteMessage(ctx, d.id, d.receipt, nil)
	if err != nil && !queueerror.HasCode(err, queueerror.MessageNotFound) {
		return d.fail("ack", err)
	}
	d.acked = true
	return nil
}

// Nack makes the message visible again after delay, rounded up to whole seconds (at most 7
// days), keeping the new pop receipt for a later Ack or Nack.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.acked {
		return fmt.Errorf("outboxazqueue: nack of queue %q message %s after it was acked", d.r.queue, d.id)
	}
	vis := ceilSeconds(min(max(delay, 0), maxVisibility))
	resp, err := d.r.client.UpdateMessage(ctx, d.id, d.receipt, string(d.text), &azqueue.UpdateMessageOptions{VisibilityTimeout: &vis})
	if err != nil {
		return d.fail("nack", err)
	}
	if resp.PopReceipt != nil {
		d.receipt = *resp.PopReceipt
	}
	return nil
}

func (d *delivery) fail(op string, err error) error {
	event := "unreadable event"
	if d.err == nil {
		event = "event " + d.msg.ID.String()
	}
	if queueerror.HasCode(err, queueerror.PopReceiptMismatch, queueerror.MessageNotFound) {
		return fmt.Errorf("outboxazqueue: %s of queue %q message %s (%s) failed: its visibility timeout of %v expired and it was received again: %w: %w",
			op, d.r.queue, d.id, event, d.r.cfg.VisibilityTimeout, ErrVisibilityExpired, err)
	}
	return fmt.Errorf("outboxazqueue: %s of queue %q message %s (%s): %w", op, d.r.queue, d.id, event, err)
}

func ceilSeconds(d time.Duration) int32 {
	return int32((d + time.Second - 1) / time.Second)
}

var (
	_ outbox.Receiver = (*Receiver)(nil)
	_ outbox.Delivery = (*delivery)(nil)
)

// MessagingSystem returns "azure_queue_storage", for telemetry ([outbox.Describer]).
func (r *Receiver) MessagingSystem() string { return messagingSystem }

// DestinationName returns the queue the Receiver reads.
func (r *Receiver) DestinationName(outbox.Message) string { return r.queue }
