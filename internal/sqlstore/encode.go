package sqlstore

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/txoutbox/outbox"
)

// Encode turns the events of one Publish call into messages, carrying ctx's trace context
// (traceparent, tracestate) in each message's headers unless the event set its own. Every
// adapter's Publish starts here, so an unencodable event fails before any SQL runs.
func Encode(ctx context.Context, events []outbox.Encodable) ([]outbox.Message, error) {
	msgs := make([]outbox.Message, len(events))
	var trace propagation.MapCarrier
	for i, e := range events {
		m, err := e.Encode()
		if err != nil {
			return nil, err
		}
		if trace == nil {
			trace = propagation.MapCarrier{}
			otel.GetTextMapPropagator().Inject(ctx, trace)
		}
		for k, v := range trace {
			if _, set := m.Headers[k]; !set {
				if m.Headers == nil {
					m.Headers = make(map[string]string, len(trace))
				}
				m.Headers[k] = v
			}
		}
		msgs[i] = m
	}
	return msgs, nil
}

// Publish encodes events and inserts them through q, the caller's transaction: the whole of
// a Publish call for adapters whose dialect SQL needs no driver-specific fast path. An event
// that cannot be encoded fails before any SQL runs.
func Publish(ctx context.Context, d Dialect, q Querier, n *Names, events []outbox.Encodable) error {
	msgs, err := Encode(ctx, events)
	if err != nil || len(msgs) == 0 {
		return err
	}
	if err := d.Insert(ctx, q, n, msgs); err != nil {
		return fmt.Errorf("publishing %d event(s) to %s: %w", len(msgs), n.Outbox, err)
	}
	return nil
}
