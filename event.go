package outbox

import (
	"fmt"
	"maps"
	"reflect"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Payload is implemented by every event payload type. EventType names the type on the wire
// ("files.parse_requested"); it is stored with the event and used by consumers to dispatch,
// never derived by reflection, so renaming a Go type does not break consumers.
//
// EventType must work on the zero value of the type (use a value receiver). A pointer type
// whose element has a value-receiver EventType works too ([Decode] and consumer.Handle
// call it on a new element, never on a nil pointer).
//
// The type must be non-empty and hold no control characters (see [Message] for every rule
// Publish checks).
type Payload interface {
	EventType() string
}

// Event is one typed event. Build it with [New]; the zero value is not publishable.
type Event[T Payload] struct {
	// ID is the event's identity end to end: the outbox row, the broker's dedup ID and the
	// consumer's inbox key. A UUIDv7, so IDs sort by creation time.
	ID uuid.UUID
	// Key orders events: events with the same key are delivered in the order they were
	// written. Events without a key are unordered and relayed fully in parallel.
	Key string
	// Headers are string metadata carried to the consumer (trace context among them).
	Headers map[string]string
	// CreatedAt is when the event was built (UTC).
	CreatedAt time.Time
	// DeliverAt, when set and in the future at Publish, schedules the event: the relay sends
	// it no earlier than that time (see [WithDeliverAt]). Zero: as soon as it commits.
	DeliverAt time.Time
	// Payload is the typed body.
	Payload T

	codec Codec
}

// Option configures an event built by [New].
type Option func(*eventOptions)

type eventOptions struct {
	id        uuid.UUID
	key       string
	headers   map[string]string
	codec     Codec
	deliverAt time.Time
}

// WithKey sets the ordering key (an aggregate ID, a user ID…).
func WithKey(key string) Option { return func(o *eventOptions) { o.key = key } }

// WithHeader adds one header.
func WithHeader(name, value string) Option {
	return func(o *eventOptions) {
		if o.headers == nil {
			o.headers = map[string]string{}
		}
		o.headers[name] = value
	}
}

// WithHeaders adds headers; later options win on a clash.
func WithHeaders(h map[string]string) Option {
	return func(o *eventOptions) {
		if o.headers == nil {
			o.headers = make(map[string]string, len(h))
		}
		maps.Copy(o.headers, h)
	}
}

// WithID sets the event ID instead of a new UUIDv7 (for events whose identity comes from
// elsewhere, such as an upstream message being forwarded).
func WithID(id uuid.UUID) Option { return func(o *eventOptions) { o.id = id } }

// WithCodec encodes the payload with c instead of [JSON].
func WithCodec(c Codec) Option { return func(o *eventOptions) { o.codec = c } }

// WithDeliverAt schedules the event: Publish stores it aside, and the relay moves it into
// the outbox and sends it no earlier than t (typically within a second after t, see
// docs/scheduled.md). Until then an adapter's Cancel can take it back, in a transaction. A
// keyed scheduled event takes its place in its key's order when it becomes due, as if it
// were published then: it neither holds its key before nor overtakes the key's events
// published before that. A time that is not in the future at Publish sends at once.
func WithDeliverAt(t time.Time) Option { return func(o *eventOptions) { o.deliverAt = t.UTC() } }

// WithDelay schedules the event d after [New] builds it: WithDeliverAt(time.Now().Add(d)).
func WithDelay(d time.Duration) Option {
	return func(o *eventOptions) { o.deliverAt = time.Now().Add(d).UTC() }
}

// New builds an event with a fresh UUIDv7 ID.
func New[T Payload](payload T, opts ...Option) Event[T] {
	var o eventOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.id == uuid.Nil {
		o.id = newID()
	}
	return Event[T]{
		ID:        o.id,
		Key:       o.key,
		Headers:   o.headers,
		CreatedAt: time.Now().UTC(),
		DeliverAt: o.deliverAt,
		Payload:   payload,
		codec:     o.codec,
	}
}

// newID returns a UUIDv7; uuid.NewV7 only fails if the system's random source does.
func newID() uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		panic(fmt.Sprintf("outbox: reading random bytes for an event ID: %v", err))
	}
	return id
}

// Type returns the payload's event type, or "" when the payload cannot name one (a nil
// pointer, an EventType that panics).
func (e Event[T]) Type() string {
	typ, _ := payloadType(e.Payload)
	return typ
}

// Encode turns the event into its stored form. It fails, without panicking, with an error
// wrapping [ErrInvalidEvent] when the event has no ID, the payload is a nil pointer or names
// no valid type, or a key or header breaks the rules of [Message]; and with an
// [EncodeError] when the codec cannot encode the payload.
func (e Event[T]) Encode() (Message, error) {
	codec := e.codec
	if codec == nil {
		codec = JSON
	}
	typ, err := payloadType(e.Payload)
	if err != nil {
		return Message{}, err
	}
	m := Message{
		ID:          e.ID,
		Type:        typ,
		Key:         e.Key,
		Headers:     maps.Clone(e.Headers),
		ContentType: codec.ContentType(),
		CreatedAt:   e.CreatedAt,
		DeliverAt:   e.DeliverAt,
	}
	if err := m.Validate(); err != nil {
		return Message{}, err
	}
	if m.Body, err = codec.Marshal(e.Payload); err != nil {
		return Message{}, &EncodeError{ID: e.ID, Type: typ, Err: err}
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now().UTC()
	}
	return m, nil
}

// payloadType returns p's event type without panicking: a nil pointer payload, or an
// EventType that panics, is an error wrapping [ErrInvalidEvent].
func payloadType(p Payload) (typ string, err error) {
	if v := reflect.ValueOf(p); !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil() {
		return "", fmt.Errorf("%w: the payload is a nil %T", ErrInvalidEvent, p)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %T.EventType panicked: %v", ErrInvalidEvent, p, r)
		}
	}()
	return p.EventType(), nil
}

// EventTypeOf returns the event type of payload type T: EventType called on T's zero value,
// or on a new element when T is a pointer type (so *P works when P has a value-receiver
// EventType). It fails instead of panicking when EventType panics.
func EventTypeOf[T Payload]() (string, error) {
	var zero T
	if rt := reflect.TypeFor[T](); rt.Kind() == reflect.Pointer {
		if p, ok := reflect.New(rt.Elem()).Interface().(T); ok {
			zero = p
		}
	}
	return payloadType(zero)
}

// Encodable is anything [Event] adapters can publish: every Event[T], and [Message] itself
// (for forwarding and replaying events that are already encoded).
type Encodable interface {
	Encode() (Message, error)
}

// Message is the encoded, untyped form of an event: what the outbox table stores and what
// transports carry.
//
// Publish accepts only what every transport can carry, so that nothing it stores is
// rejected or altered later by a broker ([Message.Validate] checks it):
//   - ID is not the zero UUID;
//   - Type is non-empty, valid UTF-8 and holds no control characters;
//   - Key is valid UTF-8, holds no control characters and neither starts nor ends with
//     white space (brokers trim or refuse it: an SQS group ID, a NATS subject token);
//   - ContentType is valid UTF-8 without control characters;
//   - header names are non-empty, valid UTF-8 and hold no control characters; header
//     values are valid UTF-8 and hold no control characters other than tab (NUL, CR and
//     LF cannot cross SQS or NATS).
type Message struct {
	// ID is the event's ID, a UUIDv7 from New: the broker's dedup ID and the inbox's key.
	ID uuid.UUID
	// Type is the event type, the payload's EventType(): consumers dispatch on it.
	Type string
	// Key orders events: those with the same key are delivered and handled in the order
	// they were written. Empty means no order.
	Key string
	// Headers are the event's own headers, and the trace context Publish adds.
	Headers map[string]string
	// ContentType is the body's media type, which picks the codec ("application/json").
	ContentType string
	// Body is the encoded payload.
	Body []byte
	// CreatedAt is when the event was made (New), in UTC.
	CreatedAt time.Time
	// DeliverAt is when a scheduled event is due ([WithDeliverAt]); zero otherwise. Publish
	// reads it; a message the relay claims or a consumer receives has it zero.
	DeliverAt time.Time
}

// Encode returns m after checking it with [Message.Validate], so a Message can be published
// wherever an Event can. An empty ContentType becomes JSON's, a zero CreatedAt now.
func (m Message) Encode() (Message, error) {
	if err := m.Validate(); err != nil {
		return Message{}, err
	}
	if m.ContentType == "" {
		m.ContentType = JSON.ContentType()
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now().UTC()
	}
	return m, nil
}

// ReplayHeader marks a message that a dead-letter replay put back into the outbox; its
// value names the replay. The event ID stays the same (consumers that already handled the
// event skip it through their inbox), but brokers that deduplicate must not drop the replay
// as a copy of the first delivery, so transports dedup by [Message.DedupID].
const ReplayHeader = "txoutbox-replay"

// DedupID is the ID a broker deduplicates m by (SQS FIFO MessageDeduplicationId, NATS
// Nats-Msg-Id): the event ID, extended with the replay mark of a replayed message.
func (m Message) DedupID() string {
	if r := m.Headers[ReplayHeader]; r != "" {
		return m.ID.String() + ":replay-" + r
	}
	return m.ID.String()
}

// Validate checks m against the rules listed on [Message] and returns an error wrapping
// [ErrInvalidEvent] that names every problem, or nil.
func (m Message) Validate() error {
	var errs []string
	if m.ID == uuid.Nil {
		errs = append(errs, "it has no ID (build events with outbox.New)")
	}
	if m.Type == "" {
		errs = append(errs, "its type is empty")
	} else if why := badText(m.Type, false); why != "" {
		errs = append(errs, fmt.Sprintf("its type %q %s", m.Type, why))
	}
	if why := badText(m.Key, false); why != "" {
		errs = append(errs, fmt.Sprintf("its key %q %s", m.Key, why))
	} else if strings.TrimSpace(m.Key) != m.Key {
		errs = append(errs, fmt.Sprintf("its key %q starts or ends with white space", m.Key))
	}
	if why := badText(m.ContentType, false); why != "" {
		errs = append(errs, fmt.Sprintf("its content type %q %s", m.ContentType, why))
	}
	for name, value := range m.Headers {
		if name == "" {
			errs = append(errs, "it has a header with an empty name")
		} else if why := badText(name, false); why != "" {
			errs = append(errs, fmt.Sprintf("its header name %q %s", name, why))
		}
		if why := badText(value, true); why != "" {
			errs = append(errs, fmt.Sprintf("its header %q has a value that %s", name, why))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w %s: %s", ErrInvalidEvent, m.ID, strings.Join(errs, "; "))
}

// badText says why s cannot cross every transport, or returns "". The relay checks every
// row it claims, so plain ASCII takes a fast path.
func badText(s string, tabOK bool) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf {
			ascii = false
			break
		} else if c < 0x20 || c == 0x7f {
			if c == '\t' && tabOK {
				continue
			}
			return fmt.Sprintf("holds the control character %U", rune(c))
		}
	}
	if ascii {
		return ""
	}
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	for _, r := range s {
		if unicode.IsControl(r) && (r != '\t' || !tabOK) {
			return fmt.Sprintf("holds the control character %U", r)
		}
	}
	return ""
}

// Decode turns a message back into a typed event. It fails with [ErrTypeMismatch] when the
// message is of another type, and with a [DecodeError] when the body cannot be decoded.
func Decode[T Payload](m Message) (Event[T], error) {
	want, err := EventTypeOf[T]()
	if err != nil {
		return Event[T]{}, err
	}
	if m.Type != want {
		return Event[T]{}, fmt.Errorf("%w: message %s is %q, not %q", ErrTypeMismatch, m.ID, m.Type, want)
	}
	codec, err := codecFor(m.ContentType)
	if err != nil {
		return Event[T]{}, &DecodeError{ID: m.ID, Type: m.Type, Err: err}
	}
	var payload T
	if err := codec.Unmarshal(m.Body, &payload); err != nil {
		return Event[T]{}, &DecodeError{ID: m.ID, Type: m.Type, Err: err}
	}
	return Event[T]{
		ID:        m.ID,
		Key:       m.Key,
		Headers:   m.Headers,
		CreatedAt: m.CreatedAt,
		Payload:   payload,
		codec:     codec,
	}, nil
}
