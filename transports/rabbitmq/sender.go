package outboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/internal/config"
)

const (
	// DefaultExchange is the exchange a [Sender] publishes to when its config names none.
	DefaultExchange = "events"
	// DefaultMaxMessageBytes is the default [SenderConfig].MaxMessageBytes: 16 MiB, the
	// default max_message_size of RabbitMQ 4 (RabbitMQ 3.8–3.13 default to 128 MiB).
	DefaultMaxMessageBytes = 16 << 20
	// MaxMessageBytesLimit is the largest max_message_size RabbitMQ can be configured with
	// (512 MiB).
	MaxMessageBytesLimit = 512 << 20
)

// SenderConfig configures a [Sender]. The zero value (or nil) means the defaults below.
type SenderConfig struct {
	// Exchange receives every message. It must exist (see [Declare]); a topic exchange
	// routes by event type naturally. Default [DefaultExchange].
	Exchange string
	// RoutingKeys routes the event types it names with fixed routing keys
	// ({"orders.created": "orders.v1.created"}); other types use their type as the key.
	RoutingKeys map[string]string
	// RoutingKey, when set, picks every message's routing key instead of RoutingKeys and
	// the type (to route by tenant header, by key…); setting both is an error.
	RoutingKey func(outbox.Message) string
	// Source is the CloudEvents source attribute of every message. Default "/txoutbox".
	Source string
	// MaxMessageBytes caps a message's body. Keep it at most the broker's max_message_size:
	// the broker closes the channel of a publish over that, failing the rest of the batch
	// with it. Larger messages fail before sending, with outbox.ErrTooLarge, and the relay
	// dead-letters them. The headers, in turn, must fit in one frame (frame_max, 128 KiB by
	// default). Default [DefaultMaxMessageBytes]; at most [MaxMessageBytesLimit].
	MaxMessageBytes int
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *SenderConfig) WithDefaults() *SenderConfig {
	out := SenderConfig{}
	if c != nil {
		out = *c
		out.RoutingKeys = maps.Clone(c.RoutingKeys)
	}
	config.Default(&out.Exchange, DefaultExchange)
	config.Default(&out.Source, cloudevents.DefaultSource)
	config.Default(&out.MaxMessageBytes, DefaultMaxMessageBytes)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *SenderConfig) validate() error {
	var errs []error
	if err := checkName(c.Exchange); err != nil {
		errs = append(errs, fmt.Errorf("Exchange %q: %w", c.Exchange, err))
	}
	if c.RoutingKey != nil && len(c.RoutingKeys) > 0 {
		errs = append(errs, errors.New("RoutingKey is set together with RoutingKeys; set one way of routing"))
	}
	for typ, key := range c.RoutingKeys {
		if typ == "" {
			errs = append(errs, fmt.Errorf("RoutingKeys has an empty event type (for key %q)", key))
		}
		if err := checkName(key); err != nil {
			errs = append(errs, fmt.Errorf("RoutingKeys[%q] = %q: %w", typ, key, err))
		}
	}
	if c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMessageBytesLimit {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is outside 1..%d", c.MaxMessageBytes, MaxMessageBytesLimit))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxrabbitmq: invalid SenderConfig: %w", errors.Join(errs...))
	}
	return nil
}

// checkName reports why s cannot be an exchange name or routing key: AMQP 0-9-1 short
// strings hold at most 255 bytes.
func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > 255:
		return fmt.Errorf("is %d bytes, over AMQP's 255", len(s))
	}
	return nil
}

// Sender publishes the relay's batches to an exchange with publisher confirms; it
// implements outbox.Sender and is safe for concurrent use. Close it when done.
type Sender struct {
	cfg  *SenderConfig
	link *link

	mu   sync.Mutex
	idle []*pubChannel // confirm-mode channels between two Sends
}

// pubChannel is a confirm-mode channel that one Send uses at a time.
type pubChannel struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	returns  chan amqp.Return
	closed   chan *amqp.Error
	closeErr error // why the channel closed, once known
}

// NewSender returns a sender that publishes through its own connection to conn.URL. It
// validates conn and cfg (nil means the defaults) and reports every problem at once; it
// connects on the first Send, and reconnects after a loss.
func NewSender(conn Connection, cfg *SenderConfig) (*Sender, error) {
	c := cfg.WithDefaults()
	conn = conn.withDefaults("txoutbox sender")
	if err := errors.Join(conn.validate(), c.validate()); err != nil {
		return nil, err
	}
	return &Sender{cfg: c, link: newLink(conn)}, nil
}

// MaxMessageBytes returns the largest body the sender accepts.
func (s *Sender) MaxMessageBytes() int { return s.cfg.MaxMessageBytes }

// RoutingKeyFor returns the routing key a message is published with.
func (s *Sender) RoutingKeyFor(m outbox.Message) (string, error) {
	var key string
	switch {
	case s.cfg.RoutingKey != nil:
		key = s.cfg.RoutingKey(m)
	case s.cfg.RoutingKeys[m.Type] != "":
		key = s.cfg.RoutingKeys[m.Type]
	default:
		key = m.Type
	}
	if err := checkName(key); err != nil {
		return "", outbox.Permanent(fmt.Errorf("outboxrabbitmq: message %s (type %q) routes with key %q, which %w", m.ID, m.Type, key, err))
	}
	return key, nil
}

// Close closes the sender's connection. Sends after Close fail with outbox.ErrClosed.
func (s *Sender) Close() error {
	s.mu.Lock()
	s.idle = nil
	s.mu.Unlock()
	return s.link.close()
}

// outgoing is one message of a Send on its way.
type outgoing struct {
	index   int
	key     string
	pub     amqp.Publishing
	confirm *amqp.DeferredConfirmation
}

// Send publishes msgs (persistent, mandatory) and waits until the broker confirmed each
// one, or ctx ends. It returns nil when the broker took them all, an *outbox.BatchError
// naming the messages that failed (the others were delivered), or an error for the whole
// batch when none could be published (the broker is unreachable). A message fails when the
// broker nacks it, returns it as unroutable (no queue is bound for its routing key), or its
// confirm never comes (the connection dropped, or ctx ended): it may still have been
// stored, and the relay's retry makes it a duplicate the consumer's inbox absorbs.
// Failures that are the broker's or the connection's — all of these but the unroutable
// return — are marked outbox.Unavailable (see the package's Outages section). A
// message over MaxMessageBytes, or that cannot be routed or encoded, is not sent and fails
// permanently (outbox.ErrTooLarge for size); the rest of the batch is sent all the same.
func (s *Sender) Send(ctx context.Context, msgs []outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	failed := map[int]error{}
	out := make([]outgoing, 0, len(msgs))
	for i, m := range msgs {
		o, err := s.prepare(i, m)
		if err != nil {
			failed[i] = err
			continue
		}
		out = append(out, o)
	}
	if len(out) == 0 {
		return &outbox.BatchError{Failed: failed}
	}
	wholeBatch := func(err error) error {
		err = markBrokerFault(err)
		if len(failed) == 0 {
			return err
		}
		for _, o := range out {
			failed[o.index] = err
		}
		return &outbox.BatchError{Failed: failed}
	}

	conn, err := s.link.connection(ctx)
	if err != nil {
		return wholeBatch(err)
	}
	if reason := s.link.blockedReason(conn); reason != "" {
		return wholeBatch(outbox.Unavailable(fmt.Errorf("outboxrabbitmq: the broker at %s blocks publishing (%s): not sending %d message(s)", s.link.where, reason, len(out))))
	}
	frameMax := conn.Config.FrameSize
	pc, err := s.acquire(conn)
	if err != nil {
		return wholeBatch(err)
	}
	clean := false
	defer func() { s.release(pc, clean) }()

	byID := make(map[string][]int, len(out)) // message-id → indexes in out, for returns
	returned := map[int]amqp.Return{}
	drainReturns := func() {
		for {
			select {
			case r, ok := <-pc.returns:
				if !ok {
					return
				}
				noteReturn(r, byID, returned)
			default:
				return
			}
		}
	}

	var stop error // once set, the rest of the batch is not published
	published := 0
	for j := range out {
		o := &out[j]
		m := msgs[o.index]
		if stop == nil && ctx.Err() != nil {
			stop = ctx.Err()
		}
		if stop != nil {
			failed[o.index] = fmt.Errorf("outboxrabbitmq: message %s not sent: %w", m.ID, stop)
			continue
		}
		if hb := headerBytes(&o.pub); frameMax > 0 && hb > frameMax-8 {
			failed[o.index] = fmt.Errorf("outboxrabbitmq: message %s has %d bytes of headers, over the connection's frame size of %d bytes: %w", m.ID, hb, frameMax, outbox.ErrTooLarge)
			continue
		}
		byID[o.pub.MessageId] = append(byID[o.pub.MessageId], j)
		o.confirm, err = pc.ch.PublishWithDeferredConfirmWithContext(ctx, s.cfg.Exchange, o.key, true, false, o.pub)
		if err != nil {
			stop = fmt.Errorf("publishing to exchange %q on %s: %w", s.cfg.Exchange, s.link.where, s.closeReason(pc, err))
			failed[o.index] = fmt.Errorf("outboxrabbitmq: message %s: %w", m.ID, stop)
			continue
		}
		published++
		drainReturns()
	}

	ended := false // ctx ended while confirms were missing
	for j := range out {
		o := &out[j]
		if o.confirm == nil {
			continue
		}
		m := msgs[o.index]
	wait:
		for {
			select {
			case <-o.confirm.Done():
				break wait
			case r, ok := <-pc.returns:
				if !ok { // the channel closed: its confirms resolve as nacks
					pc.returns = nil
					continue
				}
				noteReturn(r, byID, returned)
			case <-ctx.Done():
				select { // a confirm that already came wins over an ended context
				case <-o.confirm.Done():
					break wait
				default:
				}
				ended = true
				failed[o.index] = fmt.Errorf("outboxrabbitmq: no confirm from the broker for message %s (it may still be stored; the retry would be a duplicate): %w", m.ID, ctx.Err())
				o.confirm = nil
				break wait
			}
		}
		if o.confirm == nil {
			continue
		}
		drainReturns() // a return comes before the confirm of its message
		switch r, ok := returned[j]; {
		case ok:
			failed[o.index] = fmt.Errorf("outboxrabbitmq: the broker returned message %s as unroutable: no queue is bound to exchange %q for routing key %q (%d %s)",
				m.ID, s.cfg.Exchange, o.key, r.ReplyCode, r.ReplyText)
		case !o.confirm.Acked():
			if err := s.closeReason(pc, nil); err != nil {
				failed[o.index] = fmt.Errorf("outboxrabbitmq: message %s unconfirmed: %w", m.ID, err)
			} else {
				// The broker's state, not the message: a queue full with overflow
				// reject-publish, a quorum queue without a majority, an internal error.
				failed[o.index] = outbox.Unavailable(fmt.Errorf("outboxrabbitmq: the broker nacked message %s (exchange %q, routing key %q): it could not store it (a full queue with overflow reject-publish, a quorum queue without a majority, or an internal error)", m.ID, s.cfg.Exchange, o.key))
			}
		}
	}
	clean = !ended && stop == nil && !pc.ch.IsClosed()

	if published == 0 && stop != nil && len(failed) == len(msgs) {
		return markBrokerFault(fmt.Errorf("outboxrabbitmq: sending %d message(s): %w", len(msgs), stop))
	}
	if len(failed) > 0 {
		for i, err := range failed {
			failed[i] = markBrokerFault(err)
		}
		return &outbox.BatchError{Failed: failed}
	}
	return nil
}

// Ping checks that the broker answers, sending nothing ([outbox.Pinger]): the relay calls
// it to learn that the broker is back when it has nothing to send. It takes the sender's
// connection, dialling it if it is down, and on one of its publishing channels (opened if
// none is idle) checks that the exchange exists, a round trip to the broker. It fails as a
// Send would, marked outbox.Unavailable for the broker's faults: a dial that fails, a
// connection that is blocked (a resource alarm) or lost, an exchange that does not exist
// (yet), no answer before ctx's deadline.
func (s *Sender) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := s.link.connection(ctx)
	if err != nil {
		return markBrokerFault(err)
	}
	if reason := s.link.blockedReason(conn); reason != "" {
		return outbox.Unavailable(fmt.Errorf("outboxrabbitmq: ping: the broker at %s blocks publishing (%s)", s.link.where, reason))
	}
	// amqp091-go's synchronous methods take no context: the check runs on its own, and a
	// broker that does not answer in time fails the ping (the check ends with the
	// connection, at the latest, and Close waits for it).
	done := make(chan error, 1)
	s.link.watchers.Go(func() { done <- s.checkExchange(conn) })
	select {
	case err := <-done:
		return markBrokerFault(err)
	case <-ctx.Done():
		return outbox.Unavailable(fmt.Errorf("outboxrabbitmq: ping: no answer from the broker at %s: %w", s.link.where, ctx.Err()))
	}
}

// checkExchange declares the exchange passively on an idle publishing channel of conn (or
// a new one) and puts the channel back.
func (s *Sender) checkExchange(conn *amqp.Connection) error {
	pc, err := s.acquire(conn)
	if err != nil {
		return fmt.Errorf("outboxrabbitmq: ping: %w", err)
	}
	if err := pc.ch.ExchangeDeclarePassive(s.cfg.Exchange, "", false, false, false, false, nil); err != nil {
		s.release(pc, false)
		return fmt.Errorf("outboxrabbitmq: ping: exchange %q on %s: %w", s.cfg.Exchange, s.link.where, s.closeReason(pc, err))
	}
	s.release(pc, true)
	return nil
}

// noteReturn records which message of the batch r is.
func noteReturn(r amqp.Return, byID map[string][]int, returned map[int]amqp.Return) {
	for _, j := range byID[r.MessageId] {
		if _, dup := returned[j]; !dup {
			returned[j] = r
			return
		}
	}
}

// prepare encodes msgs[i] and checks its routing and size.
func (s *Sender) prepare(i int, m outbox.Message) (outgoing, error) {
	key, err := s.RoutingKeyFor(m)
	if err != nil {
		return outgoing{}, err
	}
	if len(m.Body) > s.cfg.MaxMessageBytes {
		return outgoing{}, fmt.Errorf("outboxrabbitmq: message %s has a body of %d bytes, over MaxMessageBytes of %d bytes: %w", m.ID, len(m.Body), s.cfg.MaxMessageBytes, outbox.ErrTooLarge)
	}
	pub, err := encode(m, s.cfg.Source)
	if err != nil {
		return outgoing{}, err
	}
	return outgoing{index: i, key: key, pub: pub}, nil
}

// closeReason explains why pc's channel failed: the broker's close reason when it closed
// the channel or connection, else err (nil when the channel is open and err is nil).
func (s *Sender) closeReason(pc *pubChannel, err error) error {
	if pc.closeErr == nil {
		select {
		case cerr, ok := <-pc.closed:
			switch {
			case ok && cerr != nil && cerr.Code == amqp.NotFound:
				pc.closeErr = fmt.Errorf("the broker closed the channel: %w (does exchange %q exist? outboxrabbitmq.Declare creates it)", cerr, s.cfg.Exchange)
			case ok && cerr != nil:
				pc.closeErr = fmt.Errorf("the broker closed the channel: %w", cerr)
			default:
				pc.closeErr = fmt.Errorf("the channel to %s closed: %w", s.link.where, amqp.ErrClosed)
			}
		default:
		}
	}
	if pc.closeErr != nil {
		return pc.closeErr
	}
	return err
}

// acquire returns an idle confirm-mode channel on conn, or opens one.
func (s *Sender) acquire(conn *amqp.Connection) (*pubChannel, error) {
	s.mu.Lock()
	for len(s.idle) > 0 {
		pc := s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		if pc.conn == conn && !pc.ch.IsClosed() {
			s.mu.Unlock()
			return pc, nil
		}
		s.link.closeChannel(pc.ch)
	}
	s.mu.Unlock()

	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("outboxrabbitmq: opening a channel to %s: %w", s.link.where, err)
	}
	pc := &pubChannel{conn: conn, ch: ch, closed: ch.NotifyClose(make(chan *amqp.Error, 1))}
	// A missing exchange would close the channel at the first publish, with every confirm
	// of the batch; checking it here names the problem instead.
	if err := ch.ExchangeDeclarePassive(s.cfg.Exchange, "", false, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("outboxrabbitmq: exchange %q on %s: %w (outboxrabbitmq.Declare creates it)", s.cfg.Exchange, s.link.where, err)
	}
	if err := ch.Confirm(false); err != nil {
		s.link.closeChannel(ch)
		return nil, fmt.Errorf("outboxrabbitmq: putting a channel to %s in confirm mode: %w", s.link.where, err)
	}
	// Returns are read while a Send waits for its confirms; the buffer lets the client's
	// reader go on meanwhile.
	pc.returns = ch.NotifyReturn(make(chan amqp.Return, 256))
	return pc, nil
}

// release puts pc back for the next Send when its last Send ended cleanly (every confirm
// in); otherwise it closes it, so no late confirm or return can reach another Send.
func (s *Sender) release(pc *pubChannel, clean bool) {
	if clean {
		s.mu.Lock()
		if _, err := s.link.current(); err == nil {
			s.idle = append(s.idle, pc)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
	s.link.closeChannel(pc.ch)
}

var (
	_ outbox.Sender = (*Sender)(nil)
	_ outbox.Pinger = (*Sender)(nil)
)

// messagingSystem is RabbitMQ's messaging.system in the OpenTelemetry conventions.
const messagingSystem = "rabbitmq"

// MessagingSystem returns "rabbitmq", for telemetry ([outbox.Describer]).
func (s *Sender) MessagingSystem() string { return messagingSystem }

// DestinationName returns the exchange messages are published to ("amq.default" for the
// default exchange), as the OpenTelemetry conventions name a RabbitMQ destination.
func (s *Sender) DestinationName(outbox.Message) string {
	if s.cfg.Exchange == "" {
		return "amq.default"
	}
	return s.cfg.Exchange
}
