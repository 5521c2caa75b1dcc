package outboxsqs

import (
	"context"
	"errors"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/brokerfault"
)

// brokerCodes are the SQS error codes of the service's state, the queue's or the
// credentials', whatever the message: throttling, a queue that does not exist (yet), KMS
// unavailable or refusing the queue's key, authentication and authorization, and the
// service's own failures.
var brokerCodes = map[string]bool{
	"QueueDoesNotExist": true, "AWS.SimpleQueueService.NonExistentQueue": true,
	"RequestThrottled": true, "ThrottlingException": true, "Throttling": true,
	"KmsThrottled": true, "KmsAccessDenied": true, "KmsDisabled": true, "KmsInvalidState": true,
	"KmsNotFound": true, "KmsOptInRequired": true, "KmsInvalidKeyUsage": true,
	"InvalidSecurity": true, "AccessDenied": true, "AccessDeniedException": true,
	"InvalidClientTokenId": true, "UnrecognizedClientException": true, "SignatureDoesNotMatch": true,
	"IncompleteSignature": true, "MissingAuthenticationToken": true, "InvalidAccessKeyId": true,
	"ExpiredToken": true, "ExpiredTokenException": true, "RequestExpired": true,
	"InternalError": true, "InternalFailure": true, "ServiceUnavailable": true,
}

// messageCodes are the SQS error codes of what one message carries (a whole call fails
// with them when it had one entry): the relay counts them against the message.
var messageCodes = map[string]bool{
	"InvalidMessageContents": true, "InvalidAttributeName": true, "InvalidAttributeValue": true,
	"InvalidParameterValue": true, "MessageTooLong": true, "BatchRequestTooLong": true,
	"UnsupportedOperation": true,
}

// isBrokerFault reports whether err failed a call for reasons of SQS, the endpoint or the
// connection: the request could not be sent (refused, reset, DNS, TLS), no answer in
// time, a 5xx or 429 answer, throttling (the service's or the SDK's own retry quota),
// credentials that could not be signed with or were refused (401, 403), or one of
// brokerCodes. An error code of messageCodes stays the message's.
func isBrokerFault(err error) bool {
	if err == nil {
		return false
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch code := api.ErrorCode(); {
		case messageCodes[code]:
			return false
		case brokerCodes[code], api.ErrorFault() == smithy.FaultServer, retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err) == aws.TrueTernary:
			return true
		}
	}
	var (
		status interface{ HTTPStatusCode() int }
		send   *smithyhttp.RequestSendError
		quota  ratelimit.QuotaExceededError
		sign   *v4.SigningError
	)
	switch {
	case errors.As(err, &status):
		if s := status.HTTPStatusCode(); s >= 500 || s == http.StatusTooManyRequests || s == http.StatusUnauthorized || s == http.StatusForbidden {
			return true
		}
	case errors.As(err, &send), errors.As(err, &quota), errors.As(err, &sign):
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) ||
		retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary || outbox.IsUnavailable(err)
}

// markBrokerFault returns err marked with outbox.Unavailable when it is the broker's fault
// (isBrokerFault), else err as it is: a permanent error stays permanent.
func markBrokerFault(err error) error { return brokerfault.Mark(err, isBrokerFault) }

// isBrokerEntryFault reports whether SQS failed one entry of a batch for reasons of its
// own (the entry's error is not the sender's fault, or is one of brokerCodes, such as a
// throttled KMS key) rather than the message's.
func isBrokerEntryFault(f types.BatchResultErrorEntry) bool {
	code := aws.ToString(f.Code)
	return !messageCodes[code] && (brokerCodes[code] || !f.SenderFault)
}
