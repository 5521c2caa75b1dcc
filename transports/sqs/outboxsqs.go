// Package outboxsqs is the txoutbox transport for Amazon SQS, standard and FIFO queues,
// through aws-sdk-go-v2's service/sqs. A [Sender] is the relay's [outbox.Sender]: it sends
// with SendMessageBatch, routes each event type to its queue, and on FIFO queues uses the
// event ID as MessageDeduplicationId and the event key as MessageGroupId. A [Receiver] is a
// consumer's [outbox.Receiver]: long-polling ReceiveMessage, Ack = DeleteMessage,
// Nack = ChangeMessageVisibility. It is for application developers whose broker is Amazon
// SQS.
//
// # Wire format
//
// Messages are CloudEvents 1.0 in binary mode: the payload is the message body and the
// context attributes are String message attributes ("ce-id", "ce-type", "ce-source",
// "ce-time", "ce-specversion", "content-type", "ce-partitionkey", "ce-traceparent"…), so a
// consumer in any language reads them with its own CloudEvents SDK.
//
// SQS allows at most 10 message attributes per message. The CloudEvents attributes take 6,
// 7 with a key; header extensions (traceparent, tracestate first) take what is left, and the
// headers that do not fit, have an empty value or characters SQS rejects travel in the
// "ce-txheaders" JSON extension, which every txoutbox receiver reads back into
// Message.Headers.
//
// SQS bodies must be text (XML 1.0 characters). A body that is not — protobuf, images,
// invalid UTF-8 — is sent base64-encoded with the attribute "txoutbox-body" = "base64"; an
// empty body (SQS needs at least one character) is sent as "-" with "txoutbox-body" =
// "empty". The [Receiver] undoes both.
//
// # FIFO queues
//
// A queue URL ending in ".fifo" is a FIFO queue. Its MessageDeduplicationId is the event ID
// (outbox.Message.DedupID: a replayed dead letter gets a fresh one), so a relay that re-sends an event within SQS's five-minute window (after a crash between
// sending and deleting it) leaves one copy. Its MessageGroupId is the event key, so a key's
// events are received in the order they were written; a key SQS does not accept as a group
// ID (over 128 characters, spaces, non-ASCII) is replaced by "sha256-" and its hex digest.
// Keyless events each get their own group unless [SenderConfig].KeylessGroupID names one.
//
// # Limits
//
// The size SQS checks is the body plus, for every attribute, its name, data type and value.
// The [Sender] computes it the same way and fails a message over [SenderConfig].MaxMessageBytes
// before sending it, with an error that wraps [outbox.ErrTooLarge], so the relay
// dead-letters it at once with the limit in the reason.
//
// # Outages
//
// A call that fails for reasons of SQS, the endpoint or the connection is the broker's
// fault, not the message's: its errors are marked with outbox.Unavailable, so the relay
// pauses and probes until SQS takes messages again, spending no message's attempts. They
// are: a request that could not be sent (refused, reset, DNS, TLS), no answer before the
// send's deadline, throttling (RequestThrottled, KmsThrottled, the SDK's own retry quota
// exhausted), a 5xx or a server-fault error code, credentials that cannot sign or are
// refused (401, 403, AccessDenied, InvalidClientTokenId, SignatureDoesNotMatch,
// ExpiredToken…), KMS errors of the queue's key, and a queue that does not exist (yet).
// In a SendMessageBatch that SQS answered, an entry failed for reasons of SQS's own (not
// the sender's fault, or one of those codes) is marked too; an entry refused for what the
// message carries (InvalidMessageContents, InvalidAttributeName, InvalidAttributeValue,
// InvalidParameterValue: permanent; MessageTooLong: outbox.ErrTooLarge) stays the
// message's. A [Receiver]'s ReceiveMessage errors are marked the same way.
// [Sender.Ping] (an [outbox.Pinger]) reads one attribute of a queue it sends to, sending
// nothing: a relay with nothing left to send learns so that SQS is back.
//
// # Memory
//
// A [Receiver] buffers nothing between calls, and SQS bounds each: one ReceiveMessage
// returns at most 10 messages of at most 1 MiB. What a consumer holds is its unsettled
// deliveries (consumer.Config.Concurrency) times that.
package outboxsqs

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// SenderAPI is the part of *sqs.Client a [Sender] uses: SendMessageBatch to send, and
// GetQueueAttributes for [Sender.Ping].
type SenderAPI interface {
	SendMessageBatch(ctx context.Context, params *sqs.SendMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	GetQueueAttributes(ctx context.Context, params *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// ReceiverAPI is the part of *sqs.Client a [Receiver] uses.
type ReceiverAPI interface {
	ReceiveMessage(ctx context.Context, params *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(ctx context.Context, params *sqs.DeleteMessageInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	ChangeMessageVisibility(ctx context.Context, params *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

var (
	_ SenderAPI   = (*sqs.Client)(nil)
	_ ReceiverAPI = (*sqs.Client)(nil)
)
