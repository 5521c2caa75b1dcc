// Package outboxazqueue is the txoutbox transport for Azure Queue Storage, over the Azure SDK's
// azqueue/v2 client. A [Sender] delivers the relay's messages, one queue message per event,
// to a queue chosen by event type; a [Receiver] hands a consumer the messages of one queue.
// It is for application developers whose broker is Azure Queue Storage.
//
// Azure Queue Storage has no message attributes, so each message is one CloudEvents 1.0
// document in structured JSON mode (what the CloudEvents SDKs of other languages read),
// base64-encoded by default, as Azure Functions' queue trigger and the .NET and Python
// SDKs' base64 policies expect (see [Encoding]). The service limits a message's text to
// 64 KiB: the sender checks every message against it before sending and fails a larger one
// with an error wrapping [outbox.ErrTooLarge], which the relay dead-letters at once.
//
// The service has no batch send, no long poll, no FIFO order and no dedup: the sender sends
// a batch's messages concurrently, the receiver polls an empty queue with a bounded backoff,
// and consumers absorb duplicates with the inbox (at-least-once, like every transport).
// [outbox.Delivery.Attempt] is the message's DequeueCount, Ack deletes the message with its
// pop receipt, and Nack makes it visible again after the delay.
//
// # Outages
//
// A request that fails for reasons of the service, the account or the connection is the
// broker's fault, not the message's: its errors are marked with outbox.Unavailable, so the
// relay pauses and probes until the service takes messages again, spending no message's
// attempts. They are: no answer (refused, reset, DNS, TLS, nothing before the send's
// deadline), a 5xx, 429 (throttling), 408, 401 or 403 answer (authentication,
// authorization), ServerBusy, InternalError, OperationTimedOut, a queue that does not exist
// (yet), is being deleted or is disabled, and an account disabled or being created. The
// service client retries a request itself first (its ClientOptions.Retry). What the
// service refuses in one message stays that message's: MessageTooLarge,
// RequestBodyTooLarge, InvalidXmlDocument, InvalidInput (rare: the size check before
// sending fails an oversize message with outbox.ErrTooLarge without a request). A
// [Receiver]'s errors are marked the same way. [Sender.Ping] (an [outbox.Pinger]) reads a
// queue's properties, sending nothing: a relay with nothing left to send learns so that the
// service is back.
//
// # Memory
//
// A [Receiver] buffers nothing between calls, and the service bounds what it returns: 32
// messages per request, 64 KiB each. What a consumer holds is its unsettled deliveries
// (consumer.Config.Concurrency) times that; a malformed message's text is held once.
package outboxazqueue

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

// MaxTextBytes is the Azure Queue Storage limit on a message's text, in UTF-8 bytes after
// encoding: 64 KiB.
const MaxTextBytes = 64 << 10

var (
	// ErrNoRoute is wrapped by the error of a message whose event type has no route and
	// whose sender has no default queue. Retrying cannot fix it, so the relay dead-letters it.
	ErrNoRoute = errors.New("outboxazqueue: no queue for event type")
	// ErrVisibilityExpired is wrapped by the error of an Ack or Nack that came too late: the
	// message's visibility timeout ran out and it was received again (Azure answers
	// PopReceiptMismatch), so this receipt no longer controls it. The message will be, or
	// was, handled again; the inbox absorbs the duplicate. Raise
	// ReceiverConfig.VisibilityTimeout above the longest handler time to avoid it.
	ErrVisibilityExpired = errors.New("outboxazqueue: visibility timeout expired before ack (message received again)")
)

// Encoding is how a message's CloudEvent JSON document is written into the queue message's
// text. A [Receiver] reads both encodings, so changing it never strands messages.
type Encoding int

const (
	// Base64 (the default) writes the document base64-encoded: any payload survives the
	// service's XML transport unchanged, and it is what Azure Functions' queue trigger
	// (messageEncoding "base64"), the .NET SDK's QueueMessageEncoding.Base64 and the Python
	// SDK's TextBase64DecodePolicy expect. It costs a third of the size: a document may be
	// at most 48 KiB.
	Base64 Encoding = iota
	// Text writes the JSON document as is: readable in Storage Explorer and by SDKs with no
	// decoding policy, and a document may use the full 64 KiB. A payload that is not valid
	// UTF-8 cannot be carried as text and fails with a permanent error.
	Text
)

// String returns "base64" or "text".
func (e Encoding) String() string {
	switch e {
	case Base64:
		return "base64"
	case Text:
		return "text"
	}
	return fmt.Sprintf("Encoding(%d)", int(e))
}

// maxDocBytes is the largest CloudEvent document that fits the limit once encoded.
func (e Encoding) maxDocBytes() int {
	if e == Text {
		return MaxTextBytes
	}
	return base64.StdEncoding.DecodedLen(MaxTextBytes) // 48 KiB
}

func (e Encoding) valid() bool { return e == Base64 || e == Text }

// queueName matches Azure's queue-name rules but the length: lowercase letters, digits and
// single hyphens, starting and ending with a letter or digit.
var queueName = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// checkQueueName returns why name is not a valid Azure queue name, or nil.
func checkQueueName(name string) error {
	if len(name) < 3 || len(name) > 63 || !queueName.MatchString(name) {
		return fmt.Errorf("queue name %q is invalid: Azure queue names are 3-63 characters of lowercase letters, digits and single hyphens, starting and ending with a letter or digit", name)
	}
	return nil
}

// encode returns m's queue message text, or a permanent error (wrapping outbox.ErrTooLarge
// when it is over the limit) before anything is sent.
func encode(m outbox.Message, source string, enc Encoding) (string, error) {
	doc, err := cloudevents.ToStructured(m, source)
	if err != nil {
		return "", outbox.Permanent(fmt.Errorf("outboxazqueue: message %s cannot be encoded as a CloudEvent: %w", m.ID, err))
	}
	size := len(doc)
	if enc == Base64 {
		size = base64.StdEncoding.EncodedLen(len(doc))
	}
	if size > MaxTextBytes {
		return "", fmt.Errorf("outboxazqueue: message %s is %s after %s encoding, over the Azure Queue Storage limit of 64 KiB (%d bytes): %w",
			m.ID, kib(size), enc, MaxTextBytes, outbox.ErrTooLarge)
	}
	if enc == Base64 {
		return base64.StdEncoding.EncodeToString(doc), nil
	}
	text, err := xmlSafe(doc)
	if err != nil {
		return "", outbox.Permanent(fmt.Errorf("outboxazqueue: message %s: %w", m.ID, err))
	}
	return text, nil
}

func kib(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%.1f KiB (%d bytes)", float64(n)/1024, n)
}

// xmlSafe returns a JSON document as text that the XML request carries unchanged. Go's
// encoding/json escapes control characters, but a raw JSON payload may hold U+FFFE and
// U+FFFF, which XML cannot carry (the SDK would silently replace them): they can only sit
// inside JSON strings, so they are written as \u escapes. Invalid UTF-8 cannot be kept.
func xmlSafe(doc []byte) (string, error) {
	if !utf8.Valid(doc) {
		return "", errors.New("its CloudEvent document is not valid UTF-8, which Text encoding cannot carry (use Base64 encoding)")
	}
	s := string(doc)
	if !strings.ContainsAny(s, "\uFFFE\uFFFF") {
		return s, nil
	}
	return strings.NewReplacer("\uFFFE", `\ufffe`, "\uFFFF", `\uffff`).Replace(s), nil
}

// decode reads a queue message's text in either encoding. A CloudEvent document starts with
// '{', which is not in the base64 alphabet, so the two cannot be confused. Its error is an
// *outbox.MalformedError holding the service's message ID and the text as received: text
// itself, not a copy, and a document that is the text (Text encoding) is a slice of it, so
// a malformed message is held once (its decoded form aside, for Base64 encoding).
func decode(messageID string, text []byte) (outbox.Message, error) {
	doc := bytes.TrimLeft(text, " \t\r\n")
	if len(doc) == 0 || doc[0] != '{' {
		b64 := bytes.TrimSpace(doc)
		doc = make([]byte, base64.StdEncoding.DecodedLen(len(b64)))
		n, err := base64.StdEncoding.Decode(doc, b64)
		if err != nil {
			err = fmt.Errorf("the text is neither a JSON CloudEvent nor base64 (%v)", err)
			return outbox.Message{}, cloudevents.Malformed(err, messageID, nil, text)
		}
		doc = doc[:n]
	}
	m, err := cloudevents.FromStructured(doc)
	if err != nil {
		return outbox.Message{}, cloudevents.Malformed(err, messageID, nil, text)
	}
	return m, nil
}

// messagingSystem is the messaging.system value of Azure Queue Storage.
const messagingSystem = "azure_queue_storage"
