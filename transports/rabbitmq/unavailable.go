package outboxrabbitmq

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/brokerfault"
)

// messageCodes are the AMQP reply codes with which the broker may refuse what one message
// carries: its size, its routing (a mandatory message no queue takes), or frames built
// from it. When in doubt an error stays the message's: one marked unavailable by mistake
// would pause the relay for as long as that message is retried. Every other code with
// which the broker closes a channel or a connection is its state or the connection's (320
// CONNECTION_FORCED when a node shuts down, 403 ACCESS_REFUSED, 404 NOT_FOUND for an
// exchange that does not exist yet, 405 RESOURCE_LOCKED, 506 RESOURCE_ERROR, 530
// NOT_ALLOWED, 541 INTERNAL_ERROR…).
var messageCodes = map[int]bool{
	amqp.ContentTooLarge:    true, // 311
	amqp.NoRoute:            true, // 312
	amqp.NoConsumers:        true, // 313
	amqp.PreconditionFailed: true, // 406: a message over max_message_size closes its channel with it
	amqp.FrameError:         true, // 501, sent by the broker
	amqp.SyntaxError:        true, // 502
	amqp.CommandInvalid:     true, // 503
	amqp.UnexpectedFrame:    true, // 505
}

// isBrokerFault reports whether err failed a publish or a consume for reasons of the
// broker or the connection: a connection or channel closed (a node down, restarting or
// forcing connections closed), a dial refused or failed (DNS, TLS, credentials, vhost),
// the broker's channel limit, an exchange or queue that does not exist (yet), access
// refused, an internal error, or no answer in time.
func isBrokerFault(err error) bool {
	if err == nil {
		return false
	}
	var ae *amqp.Error // amqp.ErrClosed, ErrCredentials, ErrVhost, ErrChannelMax are ones too
	if errors.As(err, &ae) {
		if ae.Server {
			return !messageCodes[ae.Code]
		}
		// Raised by the client: a connection that broke (a read error comes as a 501) or is
		// not open, unless one message's headers could not be framed.
		return !errors.Is(ae, amqp.ErrFieldType) && !errors.Is(ae, amqp.ErrFrameTooLarge)
	}
	return errors.Is(err, context.DeadlineExceeded) || outbox.IsUnavailable(err)
}

// markBrokerFault returns err marked with outbox.Unavailable when it is the broker's fault
// (isBrokerFault), else err as it is: a permanent error stays permanent.
func markBrokerFault(err error) error { return brokerfault.Mark(err, isBrokerFault) }
