package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/internal/config"
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
	// MaxPending bounds how many publishes of one Send wait for their acks at once: the
	// Send publishes the next message once fewer are in flight. Default 1000.
	MaxPending int
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *SenderConfig) WithDefaults() *SenderConfig {
	out := SenderConfig{}
	if c != nil {
		out = *c
		out.Subjects = maps.Clone(c.Subjects)
	}
	if out.Subject == nil && out.SubjectPrefix == "" {
		out.SubjectPrefix = DefaultSubjectPrefix
	}
	config.Default(&out.Source, cloudevents.DefaultSource)
	config.Default(&out.MaxPending, 1000)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *SenderConfig) validate() error {
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
	cfg    *SenderConfig
	prefix string // SubjectPrefix + "."

	acks  ackRouter
	onAck func(outbox.Message, *jetstream.PubAck) // tests observe the stream's acks
}

// NewSender returns a sender publishing through js. It validates cfg (nil means the
// defaults) and reports every problem at once.
//
// The sender publishes on js's connection and reads the stream's acks on a subscription of
// its own to an inbox of that connection (nc.NewInbox, so a custom inbox prefix applies),
// made at the first Send. The connection should stay open while the sender is used; Send
// fails fast while it is disconnected, with an error marked outbox.Unavailable, and the
// relay waits for the server. Each Send waits for its acks only until its context ends;
// js's async-publish options do not apply.
func NewSender(js jetstream.JetStream, cfg *SenderConfig) (*Sender, error) {
	if js == nil || js.Conn() == nil {
		return nil, errors.New("outboxnats: NewSender needs a JetStream context with a connection")
	}
	c := cfg.WithDefaults()
	err := c.validate()
	if mp := js.Conn().MaxPayload(); mp > 0 && int64(c.MaxMessageBytes) > mp {
		err = errors.Join(err, fmt.Errorf("outboxnats: SenderConfig.MaxMessageBytes %d is over the server's max payload of %s", c.MaxMessageBytes, formatBytes(int(mp))))
	}
	if err != nil {
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

// Send publishes msgs and waits until the stream acknowledged each one, or ctx ends. It
// returns nil when the stream stored them all (a duplicate the stream dropped counts as
// stored), an *outbox.BatchError naming the messages that failed, or an error for the whole
// batch when none could be published (the connection is down). Failures that are the
// server's or the connection's are marked outbox.Unavailable (see the package's Outages
// section). A message over the size limit, or that cannot be routed or carried in
// headers, is not sent and fails permanently (outbox.ErrTooLarge for size); the rest of
// the batch is sent all the same. At most MaxPending messages wait for their acks at once.
func (s *Sender) Send(ctx context.Context, msgs []outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	nc := s.js.Conn()
	if !nc.IsConnected() {
		return outbox.Unavailable(fmt.Errorf("outboxnats: cannot send %d message(s): the connection is %s: %w", len(msgs), nc.Status(), nats.ErrDisconnected))
	}
	limit, limitName := s.limit()
	// A message to publish again (after a no-responders reply) is encoded anew: the Send
	// reuses its message.
	rebuild := func(i int) (*nats.Msg, error) { return s.encode(msgs[i], limit, limitName, nil) }
	p, err := s.acks.start(nc, len(msgs), s.onAck != nil, rebuild)
	if err != nil {
		return markBrokerFault(err)
	}
	defer s.acks.finish(p)

	failed := map[int]error{}
	subjects := make([]string, len(msgs))
	enc := &encoding{subjects: map[string]string{}}
	var stop error // once set, the rest of the batch is not published
	stopped := 0
	for i, m := range msgs {
		if stop == nil {
			if err := p.wait(ctx, s.cfg.MaxPending-1); err != nil {
				stop = err
			}
		}
		if stop != nil {
			failed[i] = fmt.Errorf("outboxnats: message %s not sent: %w", m.ID, stop)
			stopped++
			continue
		}
		nm, err := s.encode(m, limit, limitName, enc)
		if err != nil {
			failed[i] = err
			continue
		}
		subjects[i] = nm.Subject
		if err := p.publish(i, nm); err != nil {
			perr := fmt.Errorf("outboxnats: publishing message %s to %s: %w", m.ID, nm.Subject, err)
			switch {
			case errors.Is(err, nats.ErrMaxPayload):
				failed[i] = fmt.Errorf("%w (%w)", perr, outbox.ErrTooLarge)
			case errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrBadHeaderMsg):
				failed[i] = outbox.Permanent(perr)
			default: // the connection is closed or its buffer full: the rest would fail alike
				failed[i], stop = perr, err
				stopped++
			}
		}
	}
	waitErr := p.wait(ctx, 0) // acks that arrived before ctx ended count
	for i, m := range msgs {
		if _, bad := failed[i]; bad {
			continue
		}
		ack, answered, err := p.outcome(i)
		switch {
		case !answered:
			failed[i] = fmt.Errorf("outboxnats: no ack from the stream for message %s on %s: %w", m.ID, subjects[i], waitErr)
		case err != nil:
			failed[i] = ackError(m, subjects[i], err)
		case s.onAck != nil:
			s.onAck(m, ack)
		}
	}
	if stopped == len(msgs) {
		return markBrokerFault(fmt.Errorf("outboxnats: sending %d message(s): %w", len(msgs), stop))
	}
	if len(failed) > 0 {
		for i, err := range failed {
			failed[i] = markBrokerFault(err)
		}
		return &outbox.BatchError{Failed: failed}
	}
	return nil
}

// Ping asks the server a question, sending nothing ([outbox.Pinger]): the relay calls it
// to learn that the server is back when it has nothing to send. With SenderConfig.Stream
// it asks for that stream's info, so a stream that does not exist (yet) fails the ping;
// otherwise for the account's JetStream info, which a server answers only with JetStream
// up. It fails as a Send would, marked outbox.Unavailable for the server's faults: the
// connection down or reconnecting, no responders, no answer before ctx's deadline, a
// missing stream, JetStream not enabled.
func (s *Sender) Ping(ctx context.Context) error {
	nc := s.js.Conn()
	if !nc.IsConnected() {
		return outbox.Unavailable(fmt.Errorf("outboxnats: ping: the connection is %s: %w", nc.Status(), nats.ErrDisconnected))
	}
	var err error
	if s.cfg.Stream != "" {
		if _, err = s.js.Stream(ctx, s.cfg.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
			return outbox.Unavailable(fmt.Errorf("outboxnats: ping: stream %s does not exist: %w", s.cfg.Stream, err))
		}
	} else {
		_, err = s.js.AccountInfo(ctx)
	}
	if err != nil {
		return markBrokerFault(fmt.Errorf("outboxnats: ping: %w", err))
	}
	return nil
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

// encoding is what a Send reuses from one message to the next: the checked subject of each
// event type (when routing depends only on the type), and one nats.Msg with its header map
// and values, since nats.go copies a message into its write buffer before PublishMsg
// returns.
type encoding struct {
	subjects map[string]string
	msg      nats.Msg
	vals     []string
}

// encode turns m into a NATS message in CloudEvents binary mode, checking that it fits. With
// e, the message is e's, valid until the next call; without, it is new.
func (s *Sender) encode(m outbox.Message, limit int, limitName string, e *encoding) (*nats.Msg, error) {
	if e == nil {
		e = &encoding{}
	}
	subj, ok := e.subjects[m.Type]
	if !ok {
		var err error
		if subj, err = s.SubjectFor(m); err != nil {
			return nil, err
		}
		if e.subjects != nil && s.cfg.Subject == nil {
			e.subjects[m.Type] = subj
		}
	}
	// Headers go straight into one nats.Header (no intermediate map), the values sharing one
	// backing array: nats.Header wants a slice per key. Their size on the wire is counted as
	// they are set.
	n := 8 + len(m.Headers) // 6 CloudEvents attributes, key, Nats-Msg-Id, expected stream
	h := e.msg.Header
	if h == nil {
		h = make(nats.Header, n)
	} else {
		clear(h)
	}
	vals := e.vals[:0]
	if cap(vals) < n {
		vals = make([]string, 0, n)
	}
	hs := len("NATS/1.0\r\n") + len("\r\n")
	set := func(k, v string) {
		if old, dup := h[k]; dup {
			hs -= headerLine(k, old[0])
		}
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
		hs += headerLine(k, v)
	}
	var (
		unsafe error
		ceID   string
	)
	if err := cloudevents.EachBinary(m, s.cfg.Source, func(k, v string) {
		if unsafe == nil && !headerSafe(v) {
			unsafe = outbox.Permanent(fmt.Errorf("outboxnats: message %s: header %s value %q cannot travel in a NATS header (leading or trailing space, or a line break)", m.ID, k, v))
		}
		if k == idHeader {
			ceID = v
		}
		set(k, v)
	}); err != nil {
		return nil, outbox.Permanent(fmt.Errorf("outboxnats: encoding message %s: %w", m.ID, err))
	}
	if unsafe != nil {
		return nil, unsafe
	}
	dedup := ceID // m.ID as text, unless a foreign id or a replay makes DedupID differ
	if m.Headers[cloudevents.IDHeader] != "" || m.Headers[outbox.ReplayHeader] != "" || ceID == "" {
		dedup = m.DedupID()
	}
	set(jetstream.MsgIDHeader, dedup)
	if s.cfg.Stream != "" {
		set(jetstream.ExpectedStreamHeader, s.cfg.Stream)
	}
	if limit > 0 && hs+len(m.Body) > limit {
		return nil, fmt.Errorf("outboxnats: message %s is %d bytes (body %d + headers %d), over %s of %s: %w",
			m.ID, hs+len(m.Body), len(m.Body), hs, limitName, formatBytes(limit), outbox.ErrTooLarge)
	}
	e.vals = vals
	e.msg = nats.Msg{Subject: subj, Header: h, Data: m.Body}
	return &e.msg, nil
}

// idHeader carries the CloudEvents id in binary mode.
const idHeader = cloudevents.HeaderPrefix + "id"

// headerLine is the size of one "key: value\r\n" header line.
func headerLine(k, v string) int { return len(k) + len(": ") + len(v) + len("\r\n") }

// headerSafe reports whether v survives a NATS header unchanged: nats.go trims surrounding
// white space (textproto.TrimString: space, tab, CR, LF) and turns line breaks into spaces,
// which would silently change the value.
func headerSafe(v string) bool {
	if v == "" {
		return true
	}
	trimmed := func(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
	return !trimmed(v[0]) && !trimmed(v[len(v)-1]) && strings.IndexByte(v, '\r') < 0 && strings.IndexByte(v, '\n') < 0
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

var (
	_ outbox.Sender = (*Sender)(nil)
	_ outbox.Pinger = (*Sender)(nil)
)

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
