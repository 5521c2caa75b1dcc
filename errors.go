package outbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/google/uuid"
)

var (
	// ErrTypeMismatch is returned by [Decode] for a message of another event type.
	ErrTypeMismatch = errors.New("outbox: event type mismatch")
	// ErrUnknownContentType is returned when no registered [Codec] has a message's content type.
	ErrUnknownContentType = errors.New("outbox: no codec registered for content type")
	// ErrTooLarge is wrapped by transports when a message exceeds the broker's size limit.
	ErrTooLarge = errors.New("outbox: message too large for transport")
	// ErrNotInTransaction is returned by adapters asked to publish outside a transaction.
	ErrNotInTransaction = errors.New("outbox: publish needs a transaction (the event must commit with your changes)")
	// ErrClosed is returned by components used after they stopped.
	ErrClosed = errors.New("outbox: closed")
	// ErrInvalidEvent is wrapped by the errors of events Publish refuses: no ID, a nil
	// payload or Encodable, or a type, key or header that breaks the rules of [Message].
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrSchema is wrapped by the adapters' Validate when an outbox's tables are not those
	// this version expects: a migration not applied, one unknown to it (a newer release
	// migrated the database), or a column missing. The error names every problem. Publish,
	// the relay's store, the inbox and the dead-letter table wrap it too when a table or
	// function they use does not exist: run Migrate (or `outbox migrate`) first.
	ErrSchema = errors.New("outbox: the schema is not migrated to this version (run Migrate or `outbox migrate`)")
	// ErrUnavailable is wrapped by the errors of [Unavailable]: a broker or a database that
	// could not be reached or refused service for reasons of its own.
	ErrUnavailable = errors.New("outbox: unavailable")
)

// unavailableError marks an error as the fault of a broker, a database or the connection
// to it, not of the message being sent or handled.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string   { return e.err.Error() }
func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// Unavailable marks err as the fault of the broker or the database, or of the connection to
// it (refused, reset, DNS, TLS, authentication, throttling, a 5xx answer, a stream or queue
// that does not exist yet, no answer in time), not of the message. The relay then pauses as
// a whole — every loop backs off and probes until a send succeeds — and spends no message's
// attempts; the consumer retries the delivery without counting it toward a dead letter.
// Transports mark their SDKs' errors with it; so may a [Sender] of your own, and a handler
// whose own downstream is down. Unavailable(nil) is nil.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err}
}

// IsUnavailable reports whether err was marked with [Unavailable], or is a failure to reach
// a server at all: a network error ([net.Error]: refused, reset, unreachable, a DNS failure,
// an I/O timeout) or a TLS certificate that does not verify. An error that is both
// [Permanent] and unavailable is permanent.
func IsUnavailable(err error) bool {
	if err == nil || IsPermanent(err) {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var (
		netErr   net.Error
		certErr  *tls.CertificateVerificationError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		recordEr tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &netErr) && error(netErr) != context.DeadlineExceeded,
		errors.As(err, &certErr), errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &recordEr):
		// (context.DeadlineExceeded is a net.Error too, but a deadline of the caller's says
		// nothing of the server: the relay marks a Send that outlived SendTimeout itself.)
		return true
	}
	for _, errno := range connErrnos {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// connErrnos are the system errors of a connection that failed or broke.
var connErrnos = []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
	syscall.EPIPE, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ENETDOWN}

// EncodeError reports a payload its codec could not encode.
type EncodeError struct {
	// ID is the event's ID.
	ID uuid.UUID
	// Type is the event type.
	Type string
	// Err is the codec's error.
	Err error
}

// Error says which event could not be encoded, and why.
func (e *EncodeError) Error() string {
	return fmt.Sprintf("outbox: encoding event %s (%s): %v", e.ID, e.Type, e.Err)
}

// Unwrap returns the codec's error.
func (e *EncodeError) Unwrap() error { return e.Err }

// DecodeError reports a message body that could not be decoded.
type DecodeError struct {
	// ID is the message's ID.
	ID uuid.UUID
	// Type is the message's event type.
	Type string
	// Err is the codec's error.
	Err error
}

// Error says which message could not be decoded, and why.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("outbox: decoding event %s (%s): %v", e.ID, e.Type, e.Err)
}

// Unwrap returns the codec's error.
func (e *DecodeError) Unwrap() error { return e.Err }

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix (a message over the broker's size
// limit, a handler that rejects its input): the relay or consumer dead-letters the event at
// once instead of retrying it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with [Permanent] or is
// [ErrTooLarge].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p) || errors.Is(err, ErrTooLarge)
}

// retryAfterError asks for a retry no sooner than after.
type retryAfterError struct {
	after time.Duration
	err   error
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter asks for the next attempt no sooner than d (a rate-limited downstream, a
// resource not ready yet). It still counts as an attempt. RetryAfter(d, nil) is nil.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{after: d, err: err}
}

// RetryDelay returns the delay requested with [RetryAfter] anywhere in err's chain.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}

// BatchError reports which messages of a [Sender.Send] batch failed. Failed maps an index in
// the batch to its error; indexes not in Failed were delivered.
type BatchError struct {
	Failed map[int]error
}

func (e *BatchError) Error() string {
	for i, err := range e.Failed {
		return fmt.Sprintf("outbox: %d of the batch's messages failed (message %d: %v)", len(e.Failed), i, err)
	}
	return "outbox: batch failed"
}

// Unwrap returns the per-message errors, so errors.Is(batchErr, ErrTooLarge) works.
func (e *BatchError) Unwrap() []error {
	out := make([]error, 0, len(e.Failed))
	for _, err := range e.Failed {
		out = append(out, err)
	}
	return out
}

// ErrMalformed is wrapped by [Delivery.Message] for broker messages that are not a valid
// envelope (not CloudEvents, no ID, no type, a body that cannot be read).
var ErrMalformed = errors.New("outbox: malformed message")

// MalformedError is the error a transport's [Delivery.Message] returns for a broker message
// that is not a valid event. It wraps [ErrMalformed] and keeps everything that arrived, so
// the consumer's dead letter preserves the evidence even after the message is acknowledged.
type MalformedError struct {
	// Partial is what could be read of the envelope: any of ID, Type, Key, Headers,
	// ContentType and CreatedAt that parsed (zero where they did not), and the body as far
	// as it was decoded (the raw body when it could not be).
	Partial Message
	// BrokerMessageID is the broker's own identity of the message (SQS MessageId, Azure
	// Queue message ID, JetStream stream sequence…), for finding it in the broker's logs.
	BrokerMessageID string
	// Attributes are the message's headers or attributes exactly as received.
	Attributes map[string]string
	// Body is the message body exactly as received, before any decoding.
	Body []byte
	// Err says what is wrong.
	Err error
}

// Error describes the problem and the broker message.
func (e *MalformedError) Error() string {
	if e.BrokerMessageID != "" {
		return fmt.Sprintf("%v: broker message %s: %v", ErrMalformed, e.BrokerMessageID, e.Err)
	}
	return fmt.Sprintf("%v: %v", ErrMalformed, e.Err)
}

// Unwrap returns ErrMalformed and the underlying error, so errors.Is(err, ErrMalformed) holds.
func (e *MalformedError) Unwrap() []error { return []error{ErrMalformed, e.Err} }
