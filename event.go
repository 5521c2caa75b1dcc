package outbox

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/google/uuid"
)

// Payload is implemented by every event payload type. EventType names the type on the wire
// ("files.parse_requested"); it is stored with the event and used by consumers to dispatch,
// never derived by reflection, so renaming a Go type does not break consumers.
//
// EventType must work on the zero value of the type (use a value receiver).
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
	// Payload is the typed body.
	Payload T

	codec Codec
}

// Option configures an event built by [New].
type Option func(*eventOptions)

type eventOptions struct {
	id      uuid.UUID
	key     string
	headers map[string]string
	codec   Codec
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

// Type returns the payload's event type.
func (e Event[T]) Type() string { return e.Payload.EventType() }

// Encode turns the event into its stored form. It fails, without panicking, when the event
// has no ID, the payload names no type or the codec cannot encode it.
func (e Event[T]) Encode() (Message, error) {
	codec := e.codec
	if codec == nil {
		codec = JSON
	}
	typ := e.Payload.EventType()
	if err := checkEnvelope(e.ID, typ); err != nil {
		return Message{}, err
	}
	body, err := codec.Marshal(e.Payload)
	if err != nil {
		return Message{}, &EncodeError{ID: e.ID, Type: typ, Err: err}
	}
	created := e.CreatedAt
	if created.IsZero() {
		created = time.Now().UTC()
	}
	return Message{
		ID:          e.ID,
		Type:        typ,
		Key:         e.Key,
		Headers:     maps.Clone(e.Headers),
		ContentType: codec.ContentType(),
		Body:        body,
		CreatedAt:   created,
	}, nil
}

// Encodable is anything [Event] adapters can publish: every Event[T], and [Message] itself
// (for forwarding and replaying events that are already encoded).
type Encodable interface {
	Encode() (Message, error)
}

// Message is the encoded, untyped form of an event: what the outbox table stores and what
// transports carry.
type Message struct {
	ID          uuid.UUID
	Type        string
	Key         string
	Headers     map[string]string
	ContentType string
	Body        []byte
	CreatedAt   time.Time
}

// Encode returns m after checking it has an ID and a type, so a Message can be published
// wherever an Event can.
func (m Message) Encode() (Message, error) {
	if err := checkEnvelope(m.ID, m.Type); err != nil {
		return Message{}, err
	}
	if m.ContentType == "" {
		m.ContentType = JSON.ContentType()
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

func checkEnvelope(id uuid.UUID, typ string) error {
	var errs []error
	if id == uuid.Nil {
		errs = append(errs, errors.New("outbox: event has no ID (build events with outbox.New)"))
	}
	if typ == "" {
		errs = append(errs, errors.New("outbox: event payload returns an empty EventType"))
	}
	return errors.Join(errs...)
}

// Decode turns a message back into a typed event. It fails with [ErrTypeMismatch] when the
// message is of another type, and with a [DecodeError] when the body cannot be decoded.
func Decode[T Payload](m Message) (Event[T], error) {
	var zero T
	if want := zero.EventType(); m.Type != want {
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
