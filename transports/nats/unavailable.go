package outboxnats

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/brokerfault"
)

// brokerErrs are the client's errors for a connection or server that cannot take a
// message now, whatever the message: the relay waits for the server instead of counting
// an attempt against each message.
var brokerErrs = []error{
	nats.ErrNoResponders, jetstream.ErrNoStreamResponse, // no stream captures the subject (yet), or it has no leader
	nats.ErrTimeout, jetstream.ErrAsyncPublishTimeout, context.DeadlineExceeded, // no answer in time
	nats.ErrConnectionClosed, nats.ErrConnectionDraining, nats.ErrConnectionReconnecting,
	nats.ErrDisconnected, nats.ErrNoServers, nats.ErrStaleConnection, nats.ErrReconnectBufExceeded,
	nats.ErrSlowConsumer, nats.ErrMaxConnectionsExceeded, jetstream.ErrConnectionClosed,
	jetstream.ErrServerShutdown, jetstream.ErrJetStreamPublisherClosed,
	nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
	nats.ErrJetStreamNotEnabled, nats.ErrJetStreamNotEnabledForAccount,
	jetstream.ErrJetStreamNotEnabled, jetstream.ErrJetStreamNotEnabledForAccount,
}

// brokerErrorCodes are JetStream API errors answered with a 4xx status that are the
// server's or the account's state, not the message's.
var brokerErrorCodes = map[jetstream.ErrorCode]bool{
	jetstream.JSErrCodeStreamNotFound: true,
	10002:                             true, // JSAccountResourcesExceededErr: the account's storage is full
}

// isBrokerFault reports whether err failed a publish or a pull for reasons of the server,
// the stream or the connection: no responders, the connection closed, reconnecting or
// stale, no answer in time, authorization, JetStream not enabled, a stream that does not
// exist or has no leader, and any JetStream API error with a 5xx status (no quorum,
// insufficient resources, a full stream that discards new messages, a stream offline).
// What the stream refuses in one message — over max_msg_size (10054), headers over the
// limit, another stream than Nats-Expected-Stream names — is the message's.
func isBrokerFault(err error) bool {
	if err == nil {
		return false
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.Code >= 500 || brokerErrorCodes[api.ErrorCode]
	}
	return brokerfault.IsAny(err, brokerErrs...) || outbox.IsUnavailable(err)
}

// markBrokerFault returns err marked with outbox.Unavailable when it is the broker's fault
// (isBrokerFault), else err as it is: a permanent error stays permanent.
func markBrokerFault(err error) error { return brokerfault.Mark(err, isBrokerFault) }
