package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
)

// TestBrokerFaultClassification: the errors of the server, the stream or the connection are
// marked outbox.Unavailable; what the stream refuses in one message is not.
func TestBrokerFaultClassification(t *testing.T) {
	api := func(status int, code jetstream.ErrorCode, text string) error {
		return &jetstream.APIError{Code: status, ErrorCode: code, Description: text}
	}
	for _, c := range []struct {
		name   string
		err    error
		broker bool
	}{
		{"no responders", nats.ErrNoResponders, true},
		{"no stream response", jetstream.ErrNoStreamResponse, true},
		{"request timeout", nats.ErrTimeout, true},
		{"send deadline", context.DeadlineExceeded, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"closed", nats.ErrConnectionClosed, true},
		{"disconnected", nats.ErrDisconnected, true},
		{"authorization", nats.ErrAuthorization, true},
		{"JetStream off", jetstream.ErrJetStreamNotEnabled, true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"store failed 503", api(503, 10077, "maximum messages exceeded"), true},
		{"insufficient resources 503", api(503, 10023, "insufficient resources"), true},
		{"stream offline 500", api(500, 10118, "stream is offline"), true},
		{"not leader 500", api(500, 10009, "JetStream cluster can not handle request"), true},
		{"stream not found 404", api(404, jetstream.JSErrCodeStreamNotFound, "stream not found"), true},
		{"account full 400", api(400, 10002, "resource limits exceeded for account"), true},
		{"over max_msg_size", api(400, jetstream.JSErrCodeStreamMessageExceedsMaximum, "message size exceeds maximum allowed"), false},
		{"headers over 64k", api(400, 10097, "header size exceeds maximum allowed of 64k"), false},
		{"expected stream", api(400, 10060, "expected stream does not match"), false},
		{"max payload", nats.ErrMaxPayload, false},
		{"bad subject", nats.ErrBadSubject, false},
		{"cancelled by the caller", context.Canceled, false},
		{"permanent", outbox.Permanent(nats.ErrNoResponders), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := markBrokerFault(fmt.Errorf("outboxnats: sending: %w", c.err)); errors.Is(err, outbox.ErrUnavailable) != c.broker {
				t.Errorf("%v: marked unavailable %v, want %v", err, !c.broker, c.broker)
			}
		})
	}
}
