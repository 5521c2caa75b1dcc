package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

// DefaultSubjectPrefix is the subject prefix a [Sender] uses when its config names none:
// event type "orders.created" is published to "events.orders.created".
const DefaultSubjectPrefix = "events"

// SenderConfig configures a [Sender]. The zero value (or nil) means the defaults below.
type SenderConfig struct {
	// SubjectPrefix is put before the event type, with a dot, to make the subject: prefix
	// "events" and type "orders.created" give "events.orders.created". It must be a valid
	// NATS subject without wildcards. Default [DefaultSubjectPrefix].
	SubjectPrefix string
	// Subjects routes the event types it names to fixed subjects instead
	// ({"orders.created": "orders.v1.created"}). Each must be a valid NATS subject without
	// wildcards.
	Subjects map[string]string
	// Subject, when set, picks every message's subject instead of SubjectPrefix and
	// Subjects (to route by tenant header, by key…); setting both is an error. A subject it
	// returns that is not a valid NATS subject fails that message permanently.
	Subject func(outbox.Message) string
	// Stream, when set, names the stream every message must land in: the server rejects a
	// publish whose subject belongs to another stream (the Nats-Expected-Stream header), so
	// a routing mistake fails loudly instead of filling the wrong stream. Default: unchecked.
	Stream string
	// Source is the CloudEvents source attribute of every message. Default "/txoutbox".
	Source string
	// MaxMessageBytes caps a message's encoded size, headers and body. The server's
	// max_payload, read from the connection at each Send, always applies; set this lower to
	// match a stream's max_msg_size. Default 0: the server's max_payload alone.
	MaxMessageBytes int
	// MaxPending bounds how many publishes of one Send wait for their acks at once. Keep it
	// at most the JetStream context's PublishAsyncMaxPending (nats.go default 4000).
	// Default 1000.
	MaxPending int
}

func (c *SenderConfig) withDefaults() SenderConfig {
	out := SenderConfig{}
	if c != nil {
		out = *c
	}
	if out.Subject == nil && out.SubjectPrefix == "" {
		out.SubjectPrefix = DefaultSubjectPrefix
	}
	if out.Source == "" {
		out.Source = outboxce.DefaultSource
	}
	if out.MaxPending == 0 {
		out.MaxPending = 1000
	}
	return out
}

func (c *SenderConfig) validate(nc *nats.Conn) error {
	var errs []error
	if c.Subject != nil && (c.SubjectPrefix != "" || len(c.Subjects) > 0) {
		errs = append(errs, errors.New("Subject is set together with SubjectPrefix or Subjects; set one way of routing"))
	}
	if c.Subject == nil {
		if err := checkSubject(c.SubjectPrefix); err != nil {
			errs = append(errs, fmt.Errorf("SubjectPrefix %q: %w", c.SubjectPrefix, err))
		}
	}
	for typ, subj := range c.Subjects {
		if typ == "" {
			errs = append(errs, fmt.Errorf("Subjects has an empty event type (for subject %q)", subj))
		}
		if err := checkSubject(subj); err != nil {
			errs = append(errs, fmt.Errorf("Subjects[%q] = %q: %w", typ, subj, err))
		}
	}
	if c.Stream != "" && strings.ContainsAny(c.Stream, ">*. /\\\t\r\n") {
		errs = append(errs, fmt.Errorf("Stream %q is not a valid stream name (no spaces, dots, wildcards or slashes)", c.Stream))
	}
	if !headerSafe(c.Source) {
		errs = append(errs, fmt.Errorf("Source %q cannot travel in a NATS header (leading or trailing space, or a line break)", c.Source))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is negative", c.MaxMessageBytes))
	} else if mp := nc.MaxPayload(); mp > 0 && int64(c.MaxMessageBytes) > mp {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is over the server's max payload of %s", c.MaxMessageBytes, formatBytes(int(mp))))
	}
	if c.MaxPending < 1 {
		errs = append(errs, fmt.Errorf("MaxPending %d is below 1", c.MaxPending))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxnats: invalid SenderConfig: %w", errors.Join(errs...))
	}
	return nil
}

// Sender publishes the relay's batches to JetStream; it implements outbox.Sender and is safe
// for concurrent use.
type Sender struct {
	js     jetstream.JetStream
	cfg    SenderConfig
	prefix string // SubjectPrefix + "."

	onAck func(outbox.Message, *jetstream.PubAck) // tests observe the stream's acks
}

// NewSender returns a sender publishing through js. It validates cfg (nil means the
// defaults) and reports every problem at once.
//
// js's connection should stay open while the sender is used; Send fails fast while it is
// disconnected, and the relay retries later. Setting jetstream.WithPublishAsyncTimeout on
// js is not needed: each Send waits for its acks only until its context ends.
func NewSender(js jetstream.JetStream, cfg *SenderConfig) (*Sender, error) {
	if js == nil || js.Conn() == nil {
		return nil, errors.New("outboxnats: NewSender needs a JetStream context with a connection")
	}
	c := cfg.withDefaults()
	if err := c.validate(js.Conn()); err != nil {
		return nil, err
	}
	s := &Sender{js: js, cfg: c}
	if c.SubjectPrefix != "" {
		s.prefix = c.SubjectPrefix + "."
	}
	return s, nil
}

// MaxMessageBytes returns the largest message, headers and body, the sender accepts now:
// the server's max_payload, or SenderConfig.MaxMessageBytes when that is lower. It is 0
// before the connection has reached a server.
func (s *Sender) MaxMessageBytes() int {
	limit, _ := s.limit()
	return limit
}

func (s *Sender) limit() (int, string) {
	limit, name := int(s.js.Conn().MaxPayload()), "the server's max payload"
	if s.cfg.MaxMessageBytes > 0 && (limit == 0 || s.cfg.MaxMessageBytes < limit) {
		limit, name = s.cfg.MaxMessageBytes, "the configured MaxMessageBytes"
	}
	return limit, name
}

// SubjectFor returns the subject a message is published to, or an error if the routing
// gives an invalid subject for it.
func (s *Sender) SubjectFor(m outbox.Message) (string, error) {
	subj := s.subject(m)
	if err := checkSubject(subj); err != nil {
		return "", outbox.Permanent(fmt.Errorf("outboxnats: message %s (type %q) routes to subject %q: %w", m.ID, m.Type, subj, err))
	}
	return subj, nil
}

// inflight is one published message waiting for the stream's ack.
type inflight struct {
	index int
	subj  string
	ack   jetstream.PubAckFuture
}

// Send publishes msgs and waits until the stream acknowledged each one, or ctx ends. It
// returns nil when the stream stored them all (a duplicate the stream dropped counts as
// stored), an *outbox.BatchError naming the messages that failed, or an error for the whole
// batch when none could be published (the connection is down). A message over the size
// limit, or that cannot be routed or carried in headers, is not sent and fails permanently
// (outbox.ErrTooLarge for size); the rest of the batch is sent all the same.
func (s *Sender) Send(ctx context.Context, msgs []outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	nc := s.js.Conn()
	if !nc.IsConnected() {
		return fmt.Errorf("outboxnats: cannot send %d message(s): the connection is %s: %w", len(msgs), nc.Status(), nats.ErrDisconnected)
	}
	limit, limitName := s.limit()

	failed := map[int]error{}
	queue := make([]inflight, 0, min(len(msgs), s.cfg.MaxPending))
	var stop error // once set, the rest of the batch is not published
	stopped := 0
	for i, m := range msgs {
		if stop == nil && ctx.Err() != nil {
			stop = ctx.Err()
		}
		if stop != nil {
			failed[i] = fmt.Errorf("outboxnats: message %s not sent: %w", m.ID, stop)
			stopped++
			continue
		}
		nm, err := s.encode(m, limit, limitName)
		if err != nil {
			failed[i] = err
			continue
		}
		if len(queue) == s.cfg.MaxPending {
			s.settle(ctx, msgs, queue[0], failed)
			queue = queue[1:]
		}
		f, err := s.js.PublishMsgAsync(nm)
		if err != nil {
			perr := fmt.Errorf("outboxnats: publishing message %s to %s: %w", m.ID, nm.Subject, err)
			switch {
			case errors.Is(err, nats.ErrMaxPayload):
				failed[i] = fmt.Errorf("%w (%w)", perr, outbox.ErrTooLarge)
			case errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrBadHeaderMsg):
				failed[i] = outbox.Permanent(perr)
			default: // the connection or the publisher is stuck: the rest would fail alike
				failed[i], stop = perr, err
				stopped++
			}
			continue
		}
		queue = append(queue, inflight{index: i, subj: nm.Subject, ack: f})
	}
	for _, p := range queue {
		s.settle(ctx, msgs, p, failed)
	}
	if stopped == len(msgs) {
		return fmt.Errorf("outboxnats: sending %d message(s): %w", len(msgs), stop)
	}
	if len(failed) > 0 {
		return &outbox.BatchError{Failed: failed}
	}
	return nil
}

// settle waits for p's ack and records a failure in failed.
func (s *Sender) settle(ctx context.Context, msgs []outbox.Message, p inflight, failed map[int]error) {
	m := msgs[p.index]
	var (
		ack *jetstream.PubAck
		err error
	)
	select { // an ack that already arrived wins over an ended context
	case ack = <-p.ack.Ok():
	case err = <-p.ack.Err():
	default:
		select {
		case ack = <-p.ack.Ok():
		case err = <-p.ack.Err():
		case <-ctx.Done():
			failed[p.index] = fmt.Errorf("outboxnats: no ack from the stream for message %s on %s: %w", m.ID, p.subj, ctx.Err())
			return
		}
	}
	if err != nil {
		failed[p.index] = ackError(m, p.subj, err)
		return
	}
	if s.onAck != nil {
		s.onAck(m, ack)
	}
}

// ackError describes a publish the stream refused or never acknowledged.
func ackError(m outbox.Message, subj string, err error) error {
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
		return fmt.Errorf("outboxnats: the stream refused message %s on %s as over its max_msg_size (set SenderConfig.MaxMessageBytes to catch this before sending): %w (%w)", m.ID, subj, err, outbox.ErrTooLarge)
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		return fmt.Errorf("outboxnats: no stream captures subject %s (message %s): %w", subj, m.ID, err)
	}
	return fmt.Errorf("outboxnats: the stream did not store message %s on %s: %w", m.ID, subj, err)
}

// encode turns m into a NATS message in CloudEvents binary mode, checking that it fits.
func (s *Sender) encode(m outbox.Message, limit int, limitName string) (*nats.Msg, error) {
	subj, err := s.SubjectFor(m)
	if err != nil {
		return nil, err
	}
	// Headers go straight into one nats.Header (no intermediate map), the values sharing one
	// backing array: nats.Header wants a slice per key. This runs once per message.
	n := 8 + len(m.Headers) // 6 CloudEvents attributes, key, Nats-Msg-Id, expected stream
	h := make(nats.Header, n)
	vals := make([]string, 0, n)
	set := func(k, v string) {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	var unsafe error
	if err := outboxce.EachBinary(m, s.cfg.Source, func(k, v string) {
		if unsafe == nil && !headerSafe(v) {
			unsafe = outbox.Permanent(fmt.Errorf("outboxnats: message %s: header %s value %q cannot travel in a NATS header (leading or trailing space, or a line break)", m.ID, k, v))
		}
		set(k, v)
	}); err != nil {
		return nil, outbox.Permanent(fmt.Errorf("outboxnats: encoding message %s: %w", m.ID, err))
	}
	if unsafe != nil {
		return nil, unsafe
	}
	set(jetstream.MsgIDHeader, m.DedupID())
	if s.cfg.Stream != "" {
		set(jetstream.ExpectedStreamHeader, s.cfg.Stream)
	}
	if hs := headerSize(h); limit > 0 && hs+len(m.Body) > limit {
		return nil, fmt.Errorf("outboxnats: message %s is %d bytes (body %d + headers %d), over %s of %s: %w",
			m.ID, hs+len(m.Body), len(m.Body), hs, limitName, formatBytes(limit), outbox.ErrTooLarge)
	}
	return &nats.Msg{Subject: subj, Header: h, Data: m.Body}, nil
}

// headerSize is the size of h on the wire, as the server counts it against max_payload:
// "NATS/1.0\r\n", a "key: value\r\n" line per value, and a closing "\r\n".
func headerSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// headerSafe reports whether v survives a NATS header unchanged: nats.go trims surrounding
// white space and turns line breaks into spaces, which would silently change the value.
func headerSafe(v string) bool {
	return textproto.TrimString(v) == v && !strings.ContainsAny(v, "\r\n")
}

// checkSubject reports why subj cannot be published to: NATS subjects are dot-separated
// non-empty tokens without white space or control characters, and a publish subject has
// no wildcard tokens.
func checkSubject(subj string) error {
	if subj == "" {
		return errors.New("is empty")
	}
	for i := 0; i < len(subj); i++ {
		if c := subj[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("contains %q at byte %d (no white space or control characters)", c, i)
		}
	}
	for tok := range strings.SplitSeq(subj, ".") {
		switch tok {
		case "":
			return errors.New("has an empty token (a leading, trailing or double dot)")
		case "*", ">":
			return fmt.Errorf("has the wildcard token %q (publish subjects are literal)", tok)
		}
	}
	return nil
}

// formatBytes writes n exactly, with a rounded binary unit when it helps.
func formatBytes(n int) string {
	const kib, mib = 1 << 10, 1 << 20
	switch {
	case n >= mib && n%mib == 0:
		return fmt.Sprintf("%d bytes (%d MiB)", n, n/mib)
	case n >= mib:
		return fmt.Sprintf("%d bytes (%.2f MiB)", n, float64(n)/mib)
	case n >= kib && n%kib == 0:
		return fmt.Sprintf("%d bytes (%d KiB)", n, n/kib)
	case n >= kib:
		return fmt.Sprintf("%d bytes (%.1f KiB)", n, float64(n)/kib)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

var _ outbox.Sender = (*Sender)(nil)

// subject routes m, unchecked.
func (s *Sender) subject(m outbox.Message) string {
	switch {
	case s.cfg.Subject != nil:
		return s.cfg.Subject(m)
	case s.cfg.Subjects[m.Type] != "":
		return s.cfg.Subjects[m.Type]
	default:
		return s.prefix + m.Type
	}
}

// messagingSystem is NATS's messaging.system value (the OpenTelemetry conventions name none).
const messagingSystem = "nats"

// MessagingSystem returns "nats", for telemetry ([outbox.Describer]).
func (s *Sender) MessagingSystem() string { return messagingSystem }

// DestinationName returns the subject m is published to.
func (s *Sender) DestinationName(m outbox.Message) string { return s.subject(m) }
