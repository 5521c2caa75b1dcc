package outboxazqueue

import (
	"context"
	"errors"
	"net/http"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2/queueerror"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/brokerfault"
)

// brokerCodes are the Queue Storage error codes of the service's, the account's or the
// queue's state, whatever the message: a queue that does not exist (yet) or is being
// deleted, an account disabled or being created, authentication and authorization, the
// service busy or failing.
var brokerCodes = map[queueerror.Code]bool{
	queueerror.QueueNotFound: true, queueerror.QueueBeingDeleted: true, queueerror.QueueDisabled: true,
	queueerror.ResourceNotFound: true, queueerror.AccountIsDisabled: true, queueerror.AccountBeingCreated: true,
	queueerror.AuthenticationFailed: true, queueerror.AuthorizationFailure: true,
	queueerror.AuthorizationPermissionMismatch: true, queueerror.AuthorizationProtocolMismatch: true,
	queueerror.AuthorizationResourceTypeMismatch: true, queueerror.AuthorizationServiceMismatch: true,
	queueerror.AuthorizationSourceIPMismatch: true, queueerror.InsufficientAccountPermissions: true,
	queueerror.InvalidAuthenticationInfo: true, queueerror.ServerBusy: true, queueerror.InternalError: true,
	queueerror.OperationTimedOut: true,
}

// messageCodes are the error codes with which the service refuses what one message
// carries (its size, or text the XML request cannot hold): they stay the message's
// whatever the status.
var messageCodes = map[queueerror.Code]bool{
	queueerror.MessageTooLarge: true, queueerror.RequestBodyTooLarge: true, queueerror.InvalidXMLDocument: true,
	queueerror.InvalidXMLNodeValue: true, queueerror.InvalidInput: true, queueerror.OutOfRangeInput: true,
}

// isBrokerFault reports whether err failed a request for reasons of Queue Storage, the
// endpoint or the connection: no answer (refused, reset, DNS, TLS, no answer in time), a
// 5xx, 429 (throttling), 408, 401 or 403 answer, or an error code of brokerCodes.
func isBrokerFault(err error) bool {
	if err == nil {
		return false
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		code := queueerror.Code(re.ErrorCode)
		switch {
		case messageCodes[code]:
			return false
		case brokerCodes[code]:
			return true
		}
		switch s := re.StatusCode; {
		case s >= 500, s == http.StatusTooManyRequests, s == http.StatusRequestTimeout,
			s == http.StatusUnauthorized, s == http.StatusForbidden:
			return true
		}
		return false
	}
	return errors.Is(err, context.DeadlineExceeded) || outbox.IsUnavailable(err)
}

// markBrokerFault returns err marked with outbox.Unavailable when it is the broker's fault
// (isBrokerFault), else err as it is: a permanent error stays permanent.
func markBrokerFault(err error) error { return brokerfault.Mark(err, isBrokerFault) }
