package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/internal/config"
)

const (
	// DefaultMaxHeldBytes is the default [ReceiverConfig].MaxHeldBytes: 64 MiB.
	DefaultMaxHeldBytes = 64 << 20
	// DefaultMaxMessageBytes is the default [ReceiverConfig].MaxMessageBytes: 1 MiB, the
	// default max_payload of a NATS server.
	DefaultMaxMessageBytes = 1 << 20
)

// ReceiverConfig configures a [Receiver]. The zero value (or nil) means the defaults below.
type ReceiverConfig struct {
	// MaxWait bounds one long poll: Receive returns no messages after waiting this long
	// for one. A Receive whose context is cancelled mid-poll leaves its pull request open
	// on the server for the rest of MaxWait; a message delivered into it in that time is
	// redelivered after the consumer's AckWait. Default 5s; at least 10ms, and at most the
	// consumer's MaxRequestExpires when that is set.
	MaxWait time.Duration
	// AsyncAck makes Ack send the acknowledgement without waiting for the server's
	// confirmation: one round trip less per message, but an ack lost on the way goes
	// unnoticed and the message is delivered again after AckWait (an idempotent handler
	// absorbs it). Default false: Ack is JetStream's double ack, and returns only once the
	// server has recorded it.
	AsyncAck bool
	// MaxHeldBytes bounds the messages (data and headers) the receiver has handed out and
	// that are not yet acknowledged, negatively acknowledged or past the consumer's
	// AckWait (the server then delivers them again). A pull that waits for a message asks
	// the server for no more than what is left (the pull's max_bytes); a pull of what is
	// ready now, which the server cannot limit by bytes, asks for as many messages as fit
	// at MaxMessageBytes each. Once nothing is left, Receive pulls nothing until a
	// delivery settles. With nothing held, a message larger than the bound still comes,
	// alone. Default [DefaultMaxHeldBytes] (64 MiB).
	MaxHeldBytes int
	// MaxMessageBytes is the largest message, data and headers, the stream can hold: the
	// server's max_payload (1 MiB by default, 64 MiB at most), or the stream's
	// max_msg_size when lower. MaxHeldBytes holds as long as no message is larger. Default
	// [DefaultMaxMessageBytes] (1 MiB).
	MaxMessageBytes int
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *ReceiverConfig) WithDefaults() *ReceiverConfig {
	out := ReceiverConfig{}
	if c != nil {
		out = *c
	}
	config.Default(&out.MaxWait, 5*time.Second)
	config.Default(&out.MaxHeldBytes, DefaultMaxHeldBytes)
	config.Default(&out.MaxMessageBytes, DefaultMaxMessageBytes)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *ReceiverConfig) validate() error {
	var errs []error
	if c.MaxWait < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("MaxWait %v is under 10ms", c.MaxWait))
	}
	if c.MaxHeldBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxHeldBytes %d is below 1", c.MaxHeldBytes))
	}
	if c.MaxMessageBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is below 1", c.MaxMessageBytes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxnats: invalid ReceiverConfig: %w", errors.Join(errs...))
	}
	return nil
}

// Receiver reads messages from a JetStream pull consumer; it implements outbox.Receiver
// and is safe for concurrent use.
type Receiver struct {
	c        jetstream.Consumer
	cfg      *ReceiverConfig
	maxBatch int           // the consumer's MaxRequestBatch or MaxAckPending, 0 if unlimited
	serial   bool          // the consumer hands out one message at a time (MaxAckPending 1)
	ackWait  time.Duration // the consumer's AckWait: a delivery held longer comes again

	mu       sync.Mutex
	held     map[*delivery]struct{} // handed out, not settled
	heldSize int                    // their sizes, added up
	settled  chan struct{}          // closed (and replaced) when a delivery settles
}

// NewReceiver returns a receiver reading through c, a durable (or long-lived) pull
// consumer with explicit acks, such as js.Consumer(ctx, stream, name) returns. It validates
// cfg (nil means the defaults) against c's configuration and reports every problem at once.
//
// Keep the consumer's MaxDeliver unlimited (-1), or above the consumer runtime's
// MaxAttempts: the server stops redelivering a message after MaxDeliver deliveries, and the
// message would then be dropped instead of dead-lettered. Handlers must finish within the
// consumer's AckWait, or the message is delivered again while they run.
func NewReceiver(c jetstream.Consumer, cfg *ReceiverConfig) (*Receiver, error) {
	if c == nil {
		return nil, errors.New("outboxnats: NewReceiver needs a jetstream.Consumer")
	}
	r := &Receiver{c: c, cfg: cfg.WithDefaults()}
	r.ackWait, r.held, r.settled = 30*time.Second, map[*delivery]struct{}{}, make(chan struct{})
	err := r.cfg.validate()
	if info := c.CachedInfo(); info != nil {
		var errs []error
		cc := info.Config
		if cc.AckPolicy != jetstream.AckExplicitPolicy {
			errs = append(errs, fmt.Errorf("consumer %s on stream %s has AckPolicy %s; Ack and Nack need %s",
				info.Name, info.Stream, cc.AckPolicy, jetstream.AckExplicitPolicy))
		}
		if cc.DeliverSubject != "" {
			errs = append(errs, fmt.Errorf("consumer %s on stream %s is a push consumer (DeliverSubject %q); use a pull consumer", info.Name, info.Stream, cc.DeliverSubject))
		}
		if cc.MaxRequestExpires > 0 && r.cfg.MaxWait > cc.MaxRequestExpires {
			errs = append(errs, fmt.Errorf("MaxWait %v is over consumer %s's MaxRequestExpires of %v", r.cfg.MaxWait, info.Name, cc.MaxRequestExpires))
		}
		if len(errs) > 0 {
			err = errors.Join(err, fmt.Errorf("outboxnats: NewReceiver: %w", errors.Join(errs...)))
		}
		r.maxBatch = cc.MaxRequestBatch
		if cc.MaxAckPending > 0 && (r.maxBatch == 0 || cc.MaxAckPending < r.maxBatch) {
			r.maxBatch = cc.MaxAckPending
		}
		r.serial = cc.MaxAckPending == 1
		if cc.AckWait > 0 {
			r.ackWait = cc.AckWait
		}
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Receive returns up to max messages: at once those the consumer has ready, otherwise the
// first to arrive within MaxWait (with any that arrived along with it), or none when
// MaxWait passes. It returns at most the consumer's MaxAckPending and MaxRequestBatch, and
// no more bytes than MaxHeldBytes leaves: while the deliveries not yet settled fill it,
// Receive waits for one to settle (or MaxWait to pass) before it pulls. Once ctx is done
// it returns ctx's error; messages the interrupted poll had received are negatively
// acknowledged, so they are redelivered at once (which counts in their Attempt).
func (r *Receiver) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := max
	if n < 1 {
		n = 1
	}
	if r.maxBatch > 0 && n > r.maxBatch {
		n = r.maxBatch
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.MaxWait)
	defer cancel()
	for {
		left, empty, settled := r.budget()
		if left == 0 { // full: wait for a delivery to settle
			select {
			case <-settled:
				continue
			case <-wctx.Done():
				return nil, ctx.Err()
			}
		}
		// First what is ready now. Not on a consumer with MaxAckPending 1, which is at
		// its limit whenever a message is out: the server drops a no-wait pull at the
		// limit without an answer (nats-server 2.9), and the client would wait out its 1s
		// fallback.
		if !r.serial {
			out, err := r.pullReady(n, left)
			if err != nil || len(out) > 0 {
				return out, err
			}
		}
		// Then the first message to come; with nothing held, whatever its size.
		opts := []jetstream.FetchOpt{jetstream.FetchContext(wctx)}
		if !empty {
			opts = append(opts, jetstream.FetchMaxBytes(left))
		}
		batch, err := r.c.Fetch(1, opts...)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case wctx.Err() != nil:
				return nil, nil
			}
			return nil, markBrokerFault(fmt.Errorf("outboxnats: pulling from consumer %s: %w", r.name(), err))
		}
		out := r.collect(batch)
		err = batch.Error()
		switch {
		case ctx.Err() != nil:
			release(out)
			return nil, ctx.Err()
		case len(out) == 0 && errors.Is(err, context.DeadlineExceeded):
			return nil, nil // the long poll ended empty
		case len(out) == 0 && err != nil:
			return nil, markBrokerFault(fmt.Errorf("outboxnats: pulling from consumer %s: %w", r.name(), err))
		case len(out) == 0 && !empty && wctx.Err() == nil:
			// The server ended the pull at once: the next message is larger than what
			// is left. It comes once deliveries settle.
			select {
			case <-settled:
				continue
			case <-wctx.Done():
				return nil, ctx.Err()
			}
		case len(out) == 0:
			return nil, nil
		}
		if len(out) < n {
			// Whatever arrived with the first message; an error here recurs on the next
			// call.
			if left, _, _ := r.budget(); left > 0 {
				more, _ := r.pullReady(n-len(out), left)
				out = append(out, more...)
			}
		}
		return out, nil
	}
}

// pullReady returns the messages the consumer has ready, without waiting: up to n, and as
// many as left bytes hold at MaxMessageBytes each (a no-wait pull takes no byte limit).
func (r *Receiver) pullReady(n, left int) ([]outbox.Delivery, error) {
	n = min(n, left/r.cfg.MaxMessageBytes)
	if n < 1 {
		return nil, nil
	}
	batch, err := r.c.FetchNoWait(n)
	if err != nil {
		return nil, markBrokerFault(fmt.Errorf("outboxnats: pulling from consumer %s: %w", r.name(), err))
	}
	out := r.collect(batch)
	if err := batch.Error(); err != nil && len(out) == 0 && !errors.Is(err, jetstream.ErrNoMessages) {
		return nil, markBrokerFault(fmt.Errorf("outboxnats: pulling from consumer %s: %w", r.name(), err))
	}
	return out, nil
}

// budget returns how many bytes the next pull may bring (what MaxHeldBytes leaves: 0 when
// nothing is), whether nothing is held, and a channel closed when a delivery settles. A
// delivery held past the consumer's AckWait no longer counts: the server delivers it
// again.
func (r *Receiver) budget() (left int, empty bool, settled <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for d := range r.held {
		if now.After(d.expires) {
			delete(r.held, d)
			r.heldSize -= d.size
		}
	}
	return max(0, r.cfg.MaxHeldBytes-r.heldSize), len(r.held) == 0, r.settled
}

// hold counts d as held until it settles.
func (r *Receiver) hold(d *delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held[d] = struct{}{}
	r.heldSize += d.size
}

// settle stops counting d (once), and wakes a Receive waiting for room.
func (r *Receiver) settle(d *delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.held[d]; !ok {
		return
	}
	delete(r.held, d)
	r.heldSize -= d.size
	close(r.settled)
	r.settled = make(chan struct{})
}

func (r *Receiver) collect(batch jetstream.MessageBatch) []outbox.Delivery {
	var out []outbox.Delivery
	for msg := range batch.Messages() {
		d := r.newDelivery(msg)
		r.hold(d)
		out = append(out, d)
	}
	return out
}

func (r *Receiver) name() string {
	if info := r.c.CachedInfo(); info != nil {
		return info.Stream + "/" + info.Name
	}
	return "(unknown)"
}

// release hands back deliveries a cancelled Receive will not return.
func release(ds []outbox.Delivery) {
	for _, d := range ds {
		dl := d.(*delivery)
		dl.r.settle(dl)
		_ = dl.msg.Nak() // best effort: otherwise they return after AckWait
	}
}

func (r *Receiver) newDelivery(msg jetstream.Msg) *delivery {
	d := &delivery{r: r, msg: msg, asyncAck: r.cfg.AsyncAck, attempt: 1, size: len(msg.Data()), expires: time.Now().Add(r.ackWait)}
	for k, vs := range msg.Headers() {
		for _, v := range vs {
			d.size += len(k) + len(v) + 4 // "k: v\r\n"
		}
	}
	if meta, err := msg.Metadata(); err == nil {
		d.attempt = int(meta.NumDelivered)
		d.stream, d.seq = meta.Stream, meta.Sequence.Stream
	}
	d.m, d.err = decode(msg.Headers(), msg.Data(), fmt.Sprintf("%s/%d", d.stream, d.seq))
	var me *outbox.MalformedError
	if errors.As(d.err, &me) {
		me.Err = fmt.Errorf("outboxnats: %s on subject %s: %w", d.describe(), msg.Subject(), me.Err)
	}
	return d
}

// decode rebuilds a message from a JetStream message's headers and data, in CloudEvents
// binary mode with "ce-" headers in any case (NATS header names are case-sensitive, and
// producers differ), or in structured mode. Its error is an *outbox.MalformedError holding
// brokerID (the stream and sequence), every header as received (the values of a repeated
// header joined by "\n", which no header value contains) and the data.
func decode(hs nats.Header, data []byte, brokerID string) (outbox.Message, error) {
	h := make(map[string]string, len(hs))
	for k, vs := range hs {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	m, err := cloudevents.FromBinary(h, data)
	if err != nil {
		raw := make(map[string]string, len(hs))
		for k, vs := range hs {
			raw[k] = strings.Join(vs, "\n")
		}
		return outbox.Message{}, cloudevents.Malformed(err, brokerID, raw, data)
	}
	return m, nil
}

// delivery is one message pulled from the consumer.
type delivery struct {
	r        *Receiver
	size     int       // data and headers, counted against MaxHeldBytes until settled
	expires  time.Time // when the server delivers it again (AckWait) if not settled
	msg      jetstream.Msg
	m        outbox.Message
	err      error
	attempt  int
	stream   string
	seq      uint64
	asyncAck bool
}

// Message returns the decoded event, or an *outbox.MalformedError for a message that is
// not a CloudEvent, keeping its stream and sequence ("ORDERS/42"), headers and data; such a
// delivery can still be acked.
func (d *delivery) Message() (outbox.Message, error) { return d.m, d.err }

// Attempt is the consumer's delivery count of this message, 1 on the first delivery.
func (d *delivery) Attempt() int { return d.attempt }

// Ack acknowledges the message: with a double ack (waiting for the server) by default.
func (d *delivery) Ack(ctx context.Context) error {
	d.r.settle(d) // acked, or delivered again after AckWait: no longer held either way
	if err := ctx.Err(); err != nil {
		return err
	}
	var err error
	if d.asyncAck {
		err = d.msg.Ack()
	} else {
		err = d.msg.DoubleAck(ctx)
	}
	if err != nil {
		return fmt.Errorf("outboxnats: acking %s: %w", d.describe(), err)
	}
	return nil
}

// Nack asks the server to deliver the message again after delay.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	d.r.settle(d)
	if err := ctx.Err(); err != nil {
		return err
	}
	var err error
	if delay > 0 {
		err = d.msg.NakWithDelay(delay)
	} else {
		err = d.msg.Nak()
	}
	if err != nil {
		return fmt.Errorf("outboxnats: nacking %s: %w", d.describe(), err)
	}
	return nil
}

// describe names the message in errors: its event ID when it has one, its place in the
// stream always.
func (d *delivery) describe() string {
	if d.err == nil && d.m.ID != uuid.Nil {
		return fmt.Sprintf("message %s (stream %s seq %d)", d.m.ID, d.stream, d.seq)
	}
	return fmt.Sprintf("message at stream %s seq %d", d.stream, d.seq)
}

var _ outbox.Receiver = (*Receiver)(nil)

// MessagingSystem returns "nats", for telemetry ([outbox.Describer]).
func (r *Receiver) MessagingSystem() string { return messagingSystem }

// DestinationName returns the stream the Receiver's consumer reads; each delivery names
// its own subject.
func (r *Receiver) DestinationName(outbox.Message) string {
	if info := r.c.CachedInfo(); info != nil {
		return info.Stream
	}
	return ""
}

// MessagingSystem returns "nats".
func (d *delivery) MessagingSystem() string { return messagingSystem }

// DestinationName returns the subject the message was published to.
func (d *delivery) DestinationName(outbox.Message) string { return d.msg.Subject() }
