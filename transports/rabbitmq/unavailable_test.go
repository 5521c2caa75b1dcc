package outboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
)

// TestBrokerFaultClassification: what closes a channel or connection for reasons of the
// broker, and what breaks the connection, is marked outbox.Unavailable; what the broker
// refuses in one message is not.
func TestBrokerFaultClassification(t *testing.T) {
	server := func(code int, reason string) error { return &amqp.Error{Code: code, Reason: reason, Server: true} }
	for _, c := range []struct {
		name   string
		err    error
		broker bool
	}{
		{"node shutting down", server(amqp.ConnectionForced, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"), true},
		{"exchange missing", server(amqp.NotFound, "NOT_FOUND - no exchange 'events' in vhost '/'"), true},
		{"access refused", server(amqp.AccessRefused, "ACCESS_REFUSED - write access to exchange 'events' refused"), true},
		{"resource locked", server(amqp.ResourceLocked, "RESOURCE_LOCKED"), true},
		{"internal error", server(amqp.InternalError, "INTERNAL_ERROR"), true},
		{"connection reset", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp: connection reset by peer"}, true},
		{"not open", amqp.ErrClosed, true},
		{"credentials", amqp.ErrCredentials, true},
		{"vhost", amqp.ErrVhost, true},
		{"channel max", amqp.ErrChannelMax, true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"no confirm in time", context.DeadlineExceeded, true},
		{"over max_message_size", server(amqp.PreconditionFailed, "PRECONDITION_FAILED - message size 200000 is larger than configured max size 131072"), false},
		{"frame error from the broker", server(amqp.FrameError, "FRAME_ERROR"), false},
		{"header type", amqp.ErrFieldType, false},
		{"header frame too large", amqp.ErrFrameTooLarge, false},
		{"no route", server(amqp.NoRoute, "NO_ROUTE"), false},
		{"sender closed", errLinkClosed, false},
		{"cancelled by the caller", context.Canceled, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := markBrokerFault(fmt.Errorf("outboxrabbitmq: publishing: %w", c.err)); errors.Is(err, outbox.ErrUnavailable) != c.broker {
				t.Errorf("%v: marked unavailable %v, want %v", err, !c.broker, c.broker)
			}
		})
	}
}
