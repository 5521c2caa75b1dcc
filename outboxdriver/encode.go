package outboxdriver

import (
	"context"
	"fmt"
	"reflect"

	"go.opentelemetry.io/otel/propagation"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/telemetry"
)

// Encode turns the events of one Publish call into messages, carrying ctx's trace context
// (traceparent, tracestate: W3C Trace Context, the CloudEvents distributed-tracing
// extension, plus what the global propagator adds) in each message's headers unless the
// event set its own. Every
// adapter's Publish starts here, so an event that cannot be encoded, or that breaks the
// rules of outbox.Message (checked here whatever Encodable produced it), fails before any
// SQL runs. Nothing in it panics: a nil Encodable, or one whose Encode panics, is an error
// wrapping outbox.ErrInvalidEvent.
func Encode(ctx context.Context, events []outbox.Encodable) ([]outbox.Message, error) {
	msgs := make([]outbox.Message, len(events))
	var trace propagation.MapCarrier
	for i, e := range events {
		m, err := encodeOne(e)
		if err != nil {
			if len(events) > 1 {
				err = fmt.Errorf("event %d of %d: %w", i+1, len(events), err)
			}
			return nil, err
		}
		if trace == nil {
			trace = propagation.MapCarrier{}
			telemetry.Propagator.Inject(ctx, trace)
		}
		for k, v := range trace {
			if _, set := m.Headers[k]; !set {
				if m.Headers == nil {
					m.Headers = make(map[string]string, len(trace))
				}
				m.Headers[k] = v
			}
		}
		if err := m.Validate(); err != nil {
			return nil, err
		}
		msgs[i] = m
	}
	return msgs, nil
}

// encodeOne encodes e without panicking.
func encodeOne(e outbox.Encodable) (m outbox.Message, err error) {
	if IsNil(e) {
		return m, fmt.Errorf("%w: got a nil %T instead of an event", outbox.ErrInvalidEvent, e)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: encoding a %T panicked: %v", outbox.ErrInvalidEvent, e, r)
		}
	}()
	return e.Encode()
}

// IsNil reports whether v is nil or a typed nil (a nil pointer, map, slice, func, channel
// or interface in an interface value): adapters check the caller's transaction with it,
// since a typed-nil *sql.Tx or pgx.Tx is not == nil and panics when used.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
