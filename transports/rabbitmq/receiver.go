package outboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/config"
)

// MaxHold is the longest an Ordered [Receiver] holds a nacked message before requeueing
// it: RabbitMQ closes a channel whose delivery stays unacknowledged past its
// consumer_timeout (30 minutes by default).
const MaxHold = 15 * time.Minute

const (
	// DefaultMaxHeldBytes is the default [ReceiverConfig].MaxHeldBytes: 64 MiB.
	DefaultMaxHeldBytes = 64 << 20
	// DefaultPrefetch is the most messages a [Receiver] asks the broker to send ahead by
	// default, when MaxHeldBytes allows as many.
	DefaultPrefetch = 100
)

// ReceiverConfig configures a [Receiver]. Queue is required; other zero fields take the
// defaults below.
type ReceiverConfig struct {
	// Queue is the queue to consume, a quorum queue with its retry queues (see [Declare]).
	// Required.
	Queue string
	// Prefetch is how many unacknowledged messages the broker sends ahead (basic.qos).
	// Keep it at least the consumer's Concurrency. Default: as many as MaxHeldBytes
	// allows at MaxMessageBytes each, at most [DefaultPrefetch] (100) and at least 1 (4 at
	// the defaults); 1 when Ordered. A Prefetch over 1 that MaxHeldBytes does not allow
	// (Prefetch × MaxMessageBytes > MaxHeldBytes) is refused.
	Prefetch int
	// MaxMessageBytes is the largest message body the queue can hold: the broker's
	// max_message_size (16 MiB by default since RabbitMQ 4.0, 128 MiB before), or less if
	// every producer of the queue sends less. It sizes the default Prefetch. Default
	// [DefaultMaxMessageBytes] (16 MiB); at most [MaxMessageBytesLimit].
	MaxMessageBytes int
	// MaxHeldBytes bounds the message bodies the receiver holds at once: the messages the
	// broker sent ahead and those handed out and not yet acknowledged. RabbitMQ cannot
	// limit prefetch by bytes (it does not implement basic.qos prefetch-size), so the bound
	// is kept by the count: Prefetch × MaxMessageBytes stays within it, one message at
	// least. With small messages, set MaxMessageBytes to the largest one (and the broker's
	// max_message_size to match) to get a larger Prefetch under the same bound. Default
	// [DefaultMaxHeldBytes] (64 MiB).
	MaxHeldBytes int
	// MaxWait bounds one Receive: it returns no messages after waiting this long for one.
	// Default 5s.
	MaxWait time.Duration
	// RetryDelays are the delays of the queue's retry queues: the same list as
	// [Topology].RetryDelays. Nack(delay) sends a message to the retry queue of the
	// smallest delay not shorter than delay (of the longest when none is). Default
	// [DefaultRetryDelays].
	RetryDelays []time.Duration
	// Ordered keeps per-key order through retries, for a single-active-consumer queue
	// ([Topology].Ordered): one message in flight (Prefetch 1), and Nack keeps the message
	// unacknowledged for its delay (at most [MaxHold]) and then hands it out again from
	// Receive, Attempt one higher, so no later message can overtake it (as it would
	// through a retry queue, or a requeue: RabbitMQ 3.x quorum queues requeue at the
	// back). Default false.
	Ordered bool
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *ReceiverConfig) WithDefaults() *ReceiverConfig {
	out := ReceiverConfig{}
	if c != nil {
		out = *c
		out.RetryDelays = slices.Clone(c.RetryDelays)
	}
	config.Default(&out.MaxMessageBytes, DefaultMaxMessageBytes)
	config.Default(&out.MaxHeldBytes, DefaultMaxHeldBytes)
	if out.Prefetch == 0 {
		out.Prefetch = 1
		if !out.Ordered && out.MaxMessageBytes > 0 {
			out.Prefetch = min(DefaultPrefetch, max(1, out.MaxHeldBytes/out.MaxMessageBytes))
		}
	}
	config.Default(&out.MaxWait, 5*time.Second)
	if len(out.RetryDelays) == 0 {
		out.RetryDelays = slices.Clone(DefaultRetryDelays)
	}
	slices.Sort(out.RetryDelays)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *ReceiverConfig) validate() error {
	var errs []error
	if err := checkName(c.Queue); err != nil {
		errs = append(errs, fmt.Errorf("Queue %q: %w", c.Queue, err))
	}
	if c.Prefetch < 1 || c.Prefetch > 65535 {
		errs = append(errs, fmt.Errorf("Prefetch %d is outside 1..65535", c.Prefetch))
	}
	if c.Ordered && c.Prefetch != 1 {
		errs = append(errs, fmt.Errorf("Prefetch %d with Ordered: an ordered receiver has one message in flight", c.Prefetch))
	}
	if c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMessageBytesLimit {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is outside 1..%d", c.MaxMessageBytes, MaxMessageBytesLimit))
	}
	if c.MaxHeldBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxHeldBytes %d is below 1", c.MaxHeldBytes))
	} else if c.Prefetch > 1 && c.MaxMessageBytes > 0 && int64(c.Prefetch)*int64(c.MaxMessageBytes) > int64(c.MaxHeldBytes) {
		errs = append(errs, fmt.Errorf("Prefetch %d × MaxMessageBytes %d is over MaxHeldBytes %d: lower Prefetch (or leave it to its default, %d), set MaxMessageBytes to your largest message, or raise MaxHeldBytes",
			c.Prefetch, c.MaxMessageBytes, c.MaxHeldBytes, max(1, c.MaxHeldBytes/c.MaxMessageBytes)))
	}
	if c.MaxWait < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("MaxWait %v is under 10ms", c.MaxWait))
	}
	if errs = append(errs, checkRetryDelays(c.Queue, c.RetryDelays)...); len(errs) > 0 {
		return fmt.Errorf("outboxrabbitmq: invalid ReceiverConfig: %w", errors.Join(errs...))
	}
	return nil
}

// Receiver consumes a queue with manual acknowledgements; it implements outbox.Receiver
// and is safe for concurrent use. Close it when done.
type Receiver struct {
	cfg  *ReceiverConfig
	link *link

	mu      sync.Mutex
	sub     *subscription            // nil until the first Receive, and after a loss
	retryCh *pubChannel              // confirm-mode channel for retry copies, nil until needed
	retryMu sync.Mutex               // one retry copy at a time on retryCh
	holds   map[*time.Timer]struct{} // ordered: nacked deliveries waiting out their delay
	ready   []*delivery              // ordered: held deliveries due again
	wake    chan struct{}            // a held delivery became ready
	closed  bool
}

// subscription is a consumer on one channel: its deliveries and acks belong to it alone.
type subscription struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
}

// NewReceiver returns a receiver consuming cfg.Queue through its own connection to
// conn.URL. It validates conn and cfg and reports every problem at once; it connects on
// the first Receive, and reconnects after a loss (the broker requeues what was
// unacknowledged on the lost connection, so those messages come again, Attempt one higher).
func NewReceiver(conn Connection, cfg *ReceiverConfig) (*Receiver, error) {
	c := cfg.WithDefaults()
	conn = conn.withDefaults("txoutbox receiver")
	if err := errors.Join(conn.validate(), c.validate()); err != nil {
		return nil, err
	}
	return &Receiver{cfg: c, link: newLink(conn), holds: map[*time.Timer]struct{}{}, wake: make(chan struct{}, 1)}, nil
}

// Close stops consuming and closes the connection: the broker requeues every message not
// acknowledged yet. Receives after Close fail with outbox.ErrClosed.
func (r *Receiver) Close() error {
	r.mu.Lock()
	r.closed = true
	for t := range r.holds {
		t.Stop()
	}
	r.holds, r.ready = nil, nil
	r.sub, r.retryCh = nil, nil
	r.mu.Unlock()
	return r.link.close()
}

// Receive returns up to limit messages: those the broker has sent ahead at once, otherwise
// the first to arrive within MaxWait (with any that came along with it), or none when
// MaxWait passes. Once ctx is done it returns ctx's error. A lost connection or channel
// is an error; the next Receive reconnects.
func (r *Receiver) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sub, err := r.subscribe(ctx)
	if err != nil {
		return nil, markBrokerFault(err)
	}
	limit = min(max(limit, 1), r.cfg.Prefetch)
	if out := r.takeReady(limit); len(out) > 0 {
		return out, nil
	}
	var out []outbox.Delivery
	wait := time.NewTimer(r.cfg.MaxWait)
	defer wait.Stop()
	for len(out) == 0 {
		select {
		case d, ok := <-sub.deliveries:
			if !ok {
				return nil, r.lost(sub)
			}
			out = append(out, r.newDelivery(sub, &d))
		case <-r.wake:
			if out = r.takeReady(limit); len(out) > 0 {
				return out, nil
			}
		case <-wait.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	for len(out) < limit {
		select {
		case d, ok := <-sub.deliveries:
			if !ok {
				return out, nil // the next Receive reports the loss
			}
			out = append(out, r.newDelivery(sub, &d))
			continue
		default:
		}
		break
	}
	return out, nil
}

// subscribe returns the live subscription, consuming the queue on a new channel if
// there is none.
func (r *Receiver) subscribe(ctx context.Context) (*subscription, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errLinkClosed
	}
	if r.sub != nil && !r.sub.ch.IsClosed() {
		return r.sub, nil
	}
	r.sub = nil
	conn, err := r.link.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("outboxrabbitmq: opening a channel to %s: %w", r.link.where, err)
	}
	if err := ch.Qos(r.cfg.Prefetch, 0, false); err != nil {
		r.link.closeChannel(ch)
		return nil, fmt.Errorf("outboxrabbitmq: setting prefetch %d: %w", r.cfg.Prefetch, err)
	}
	deliveries, err := ch.Consume(r.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		r.link.closeChannel(ch)
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return nil, fmt.Errorf("outboxrabbitmq: queue %q does not exist on %s (outboxrabbitmq.Declare creates it): %w", r.cfg.Queue, r.link.where, err)
		}
		return nil, fmt.Errorf("outboxrabbitmq: consuming queue %q on %s: %w", r.cfg.Queue, r.link.where, err)
	}
	r.sub = &subscription{conn: conn, ch: ch, deliveries: deliveries}
	return r.sub, nil
}

// lost forgets sub, whose deliveries stopped (channel or connection closed, or the broker
// cancelled the consumer because the queue was deleted), and says so.
func (r *Receiver) lost(sub *subscription) error {
	r.mu.Lock()
	if r.sub == sub {
		r.sub = nil
	}
	closed := r.closed
	r.mu.Unlock()
	r.link.closeChannel(sub.ch)
	if closed {
		return errLinkClosed
	}
	return outbox.Unavailable(fmt.Errorf("outboxrabbitmq: consuming queue %q on %s stopped (connection or channel lost, or the queue was deleted); the next Receive resubscribes", r.cfg.Queue, r.link.where))
}

func (r *Receiver) newDelivery(sub *subscription, d *amqp.Delivery) *delivery {
	dl := &delivery{r: r, sub: sub, tag: d.DeliveryTag, raw: d, attempt: attemptOf(d)}
	dl.m, dl.err = decode(d, "queue "+r.cfg.Queue)
	return dl
}

// attemptOf counts d's deliveries: the attempts before its last trip through a retry
// queue (AttemptsHeader), plus the queue's redeliveries of this copy (quorum queues'
// x-delivery-count; a classic queue only says whether it redelivered), plus this one.
func attemptOf(d *amqp.Delivery) int {
	n := 1 + intHeader(d.Headers[AttemptsHeader])
	if c, ok := d.Headers["x-delivery-count"]; ok {
		n += intHeader(c)
	} else if d.Redelivered {
		n++
	}
	return n
}

func intHeader(v any) int {
	switch v := v.(type) {
	case int8:
		return int(v)
	case int16:
		return int(v)
	case int32:
		return int(v)
	case int64:
		return int(v)
	case int:
		return v
	case uint8:
		return int(v)
	case uint16:
		return int(v)
	case uint32:
		return int(v)
	}
	return 0
}

// delivery is one message consumed from the queue.
type delivery struct {
	r       *Receiver
	sub     *subscription
	tag     uint64
	raw     *amqp.Delivery
	m       outbox.Message
	err     error
	attempt int
}

// Message returns the decoded event, or an *outbox.MalformedError (wrapping
// outbox.ErrMalformed) for a message that is not a txoutbox CloudEvent; such a delivery
// can still be acked.
func (d *delivery) Message() (outbox.Message, error) { return d.m, d.err }

// Attempt counts this message's deliveries, 1 on the first.
func (d *delivery) Attempt() int { return d.attempt }

// Ack acknowledges the message on the channel it came from. If that channel is gone, the
// broker has requeued the message already and Ack fails: the message comes again.
func (d *delivery) Ack(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.sub.ch.Ack(d.tag, false); err != nil {
		return fmt.Errorf("outboxrabbitmq: acking %s: %w", d.describe(), d.settleError(err))
	}
	return nil
}

// Nack makes the message come again after delay. An ordered receiver holds it for the
// delay (at most MaxHold) and then hands it out again itself. Otherwise a delay of 0
// requeues it at once, and
// a copy goes to the retry queue whose delay is the smallest not shorter than delay (the
// longest when none is), counting this attempt in its AttemptsHeader, and once the broker
// confirmed the copy the message is acknowledged; if the copy cannot be stored, the
// message is requeued at once instead, and the error says why.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := d.r
	if r.cfg.Ordered {
		return d.hold(min(delay, MaxHold))
	}
	if delay <= 0 {
		return d.requeue()
	}
	if d.sub.ch.IsClosed() {
		return fmt.Errorf("outboxrabbitmq: nacking %s: %w", d.describe(), d.settleError(amqp.ErrClosed))
	}
	tier := retryTier(r.cfg.RetryDelays, delay)
	if err := r.publishRetry(ctx, d, tier); err != nil {
		if rerr := d.requeue(); rerr != nil {
			return errors.Join(err, rerr)
		}
		return fmt.Errorf("%w; requeued it for an immediate retry instead", err)
	}
	if err := d.sub.ch.Ack(d.tag, false); err != nil {
		// The retry copy is stored and the original comes again too: a duplicate, which
		// the consumer's inbox absorbs.
		return fmt.Errorf("outboxrabbitmq: acking %s after sending its retry copy: %w", d.describe(), d.settleError(err))
	}
	return nil
}

func (d *delivery) requeue() error {
	if err := d.sub.ch.Nack(d.tag, false, true); err != nil {
		return fmt.Errorf("outboxrabbitmq: requeueing %s: %w", d.describe(), d.settleError(err))
	}
	return nil
}

// hold hands the message out again after delay, keeping it unacknowledged meanwhile, so
// the broker (prefetch 1) delivers nothing after it: an ordered queue's next message waits.
func (d *delivery) hold(delay time.Duration) error {
	r := d.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("outboxrabbitmq: nacking %s: %w", d.describe(), errLinkClosed)
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, live := r.holds[t]; !live {
			return
		}
		delete(r.holds, t)
		if d.sub.ch.IsClosed() {
			return // the broker requeued it with its channel
		}
		d.attempt++
		r.ready = append(r.ready, d)
		select {
		case r.wake <- struct{}{}:
		default:
		}
	})
	r.holds[t] = struct{}{}
	return nil
}

// takeReady returns up to limit held deliveries that are due again.
func (r *Receiver) takeReady(limit int) []outbox.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []outbox.Delivery
	for len(r.ready) > 0 && len(out) < limit {
		d := r.ready[0]
		r.ready = r.ready[1:]
		if !d.sub.ch.IsClosed() {
			out = append(out, d)
		}
	}
	return out
}

// settleError explains a failed ack or nack: on a closed channel, that the broker
// requeued the message.
func (d *delivery) settleError(err error) error {
	if errors.Is(err, amqp.ErrClosed) || d.sub.ch.IsClosed() {
		return fmt.Errorf("its channel closed, so the broker requeued it and delivers it again: %w", err)
	}
	return err
}

// describe names the message in errors: its event ID when it has one, its place always.
func (d *delivery) describe() string {
	if d.err == nil && d.m.ID != uuid.Nil {
		return fmt.Sprintf("message %s (queue %s, delivery tag %d)", d.m.ID, d.r.cfg.Queue, d.tag)
	}
	return fmt.Sprintf("message at queue %s delivery tag %d", d.r.cfg.Queue, d.tag)
}

// publishRetry stores a copy of d in the retry queue of delay and waits for the broker's
// confirm.
func (r *Receiver) publishRetry(ctx context.Context, d *delivery, delay time.Duration) error {
	queue := RetryQueueName(r.cfg.Queue, delay)
	fail := func(err error) error {
		return fmt.Errorf("outboxrabbitmq: sending %s to retry queue %s: %w", d.describe(), queue, err)
	}
	r.retryMu.Lock()
	defer r.retryMu.Unlock()
	pc, err := r.retryChannel(d.sub.conn)
	if err != nil {
		return fail(err)
	}
	raw := d.raw
	headers := make(amqp.Table, len(raw.Headers)+1)
	for k, v := range raw.Headers {
		if !strings.HasPrefix(k, "x-") { // the broker's own (x-death, x-delivery-count…)
			headers[k] = v
		}
	}
	headers[AttemptsHeader] = int64(d.attempt)
	dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		Headers:         headers,
		ContentType:     raw.ContentType,
		ContentEncoding: raw.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        raw.Priority,
		CorrelationId:   raw.CorrelationId,
		ReplyTo:         raw.ReplyTo,
		MessageId:       raw.MessageId,
		Timestamp:       raw.Timestamp,
		Type:            raw.Type,
		AppId:           raw.AppId,
		Body:            raw.Body,
	})
	if err != nil {
		r.dropRetryChannel(pc)
		return fail(err)
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		r.dropRetryChannel(pc) // a late confirm must not answer the next copy
		return fail(fmt.Errorf("no confirm: %w", ctx.Err()))
	}
	select {
	case ret, ok := <-pc.returns:
		if ok {
			return fail(fmt.Errorf("the broker returned it as unroutable (%d %s): does the retry queue exist? outboxrabbitmq.Declare creates it", ret.ReplyCode, ret.ReplyText))
		}
	default:
	}
	if !dc.Acked() {
		r.dropRetryChannel(pc)
		return fail(errors.New("the broker did not confirm it"))
	}
	return nil
}

// retryChannel returns the confirm-mode channel for retry copies on conn, opening it if
// needed. Callers hold retryMu.
func (r *Receiver) retryChannel(conn *amqp.Connection) (*pubChannel, error) {
	r.mu.Lock()
	pc := r.retryCh
	r.mu.Unlock()
	if pc != nil && pc.conn == conn && !pc.ch.IsClosed() {
		return pc, nil
	}
	if pc != nil {
		r.dropRetryChannel(pc)
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		r.link.closeChannel(ch)
		return nil, err
	}
	pc = &pubChannel{conn: conn, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}
	r.mu.Lock()
	r.retryCh = pc
	r.mu.Unlock()
	return pc, nil
}

func (r *Receiver) dropRetryChannel(pc *pubChannel) {
	r.mu.Lock()
	if r.retryCh == pc {
		r.retryCh = nil
	}
	r.mu.Unlock()
	r.link.closeChannel(pc.ch)
}

var _ outbox.Receiver = (*Receiver)(nil)

// MessagingSystem returns "rabbitmq", for telemetry ([outbox.Describer]).
func (r *Receiver) MessagingSystem() string { return messagingSystem }

// DestinationName returns the queue the Receiver consumes.
func (r *Receiver) DestinationName(outbox.Message) string { return r.cfg.Queue }
