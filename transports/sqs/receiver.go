package outboxsqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
)

// receiveMax is the most messages one ReceiveMessage call returns.
const receiveMax = 10

// Receiver receives outbox messages from one SQS queue; it is a consumer's
// [outbox.Receiver]. It is safe for concurrent use.
type Receiver struct {
	client ReceiverAPI
	cfg    *ReceiverConfig
	q      *queue
}

// NewReceiver returns a Receiver over client (normally an *sqs.Client). cfg is validated
// here: every problem in it is reported at once.
func NewReceiver(client ReceiverAPI, cfg *ReceiverConfig) (*Receiver, error) {
	c := cfg.WithDefaults()
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("outboxsqs: NewReceiver needs a client (an *sqs.Client)"))
	}
	if err := c.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	q, _ := parseQueue(c.QueueURL)
	return &Receiver{client: client, cfg: c, q: q}, nil
}

// pollMargin is how long before ctx's deadline a long poll is made to end, so that SQS
// answers before the caller gives up: messages SQS hands to a request nobody reads any more
// stay hidden until their visibility timeout.
const pollMargin = 500 * time.Millisecond

// Receive long-polls the queue for up to n messages (SQS returns at most 10 per call) and
// returns as soon as there is one, or none once WaitTime passes. It returns ctx's error once
// ctx is done. A message that is not a CloudEvent is still returned: its Message method
// reports an *outbox.MalformedError keeping the SQS MessageId, every attribute and the body
// as received, and it can be acked.
//
// When ctx has a deadline, the long poll is shortened to end half a second before it; with
// less than 1.5s left, Receive polls once without waiting (on a queue without its own
// ReceiveMessageWaitTimeSeconds) and, finding nothing, waits for the deadline. Cancelling
// ctx (rather than letting a deadline pass) abandons the poll in flight, and messages SQS
// hands to it reappear only after their visibility timeout, as with any SQS client.
func (r *Receiver) Receive(ctx context.Context, n int) ([]outbox.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	wait := r.cfg.WaitTime
	if deadline, ok := ctx.Deadline(); ok {
		wait = max(min(wait, (time.Until(deadline)-pollMargin).Truncate(time.Second)), 0)
	}
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    &r.q.url,
		MaxNumberOfMessages:         int32(min(receiveMax, max(n, 1))),
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           int32(r.cfg.VisibilityTimeout / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
	}
	if r.q.fifo {
		// The SDK retries a failed call with the same input: with an attempt ID, SQS then
		// returns the messages the lost response had, instead of hiding them.
		in.ReceiveRequestAttemptId = ptr(uuid.NewString())
	}
	out, err := r.client.ReceiveMessage(ctx, in, withPlainBody)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, markBrokerFault(fmt.Errorf("outboxsqs: receiving from %s: %w", r.q.name, err))
	}
	if len(out.Messages) == 0 && wait == 0 {
		if _, ok := ctx.Deadline(); ok { // too close to the deadline for another poll
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	ds := make([]outbox.Delivery, 0, len(out.Messages))
	for _, m := range out.Messages {
		d := &delivery{r: r, sqsID: deref(m.MessageId), receipt: deref(m.ReceiptHandle), attempt: 1}
		if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
			d.attempt = n
		}
		d.msg, d.err = decode(m)
		var me *outbox.MalformedError
		if errors.As(d.err, &me) {
			me.Err = fmt.Errorf("outboxsqs: queue %s: %w", r.q.name, me.Err)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// delivery is one received SQS message.
type delivery struct {
	r       *Receiver
	sqsID   string
	receipt string
	attempt int
	msg     outbox.Message
	err     error
}

func (d *delivery) Message() (outbox.Message, error) { return d.msg, d.err }

func (d *delivery) Attempt() int { return d.attempt }

// Ack deletes the message from the queue.
func (d *delivery) Ack(ctx context.Context) error {
	_, err := d.r.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &d.r.q.url, ReceiptHandle: &d.receipt}, withPlainBody)
	if err != nil {
		return fmt.Errorf("outboxsqs: deleting %s from %s: %w", d.describe(), d.r.q.name, err)
	}
	return nil
}

// Nack makes the message visible again after delay (rounded up to whole seconds, at most
// 12h) by changing its visibility timeout.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	secs := min((max(delay, 0)+time.Second-1)/time.Second, maxVisibility/time.Second)
	_, err := d.r.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          &d.r.q.url,
		ReceiptHandle:     &d.receipt,
		VisibilityTimeout: int32(secs),
	}, withPlainBody)
	if err != nil {
		return fmt.Errorf("outboxsqs: releasing %s in %s for another attempt in %v: %w", d.describe(), d.r.q.name, time.Duration(secs)*time.Second, err)
	}
	return nil
}

// describe names the message in errors: its event ID when it has one.
func (d *delivery) describe() string {
	if d.err == nil {
		return "message " + d.msg.ID.String()
	}
	return "SQS message " + d.sqsID
}

var _ outbox.Receiver = (*Receiver)(nil)

// MessagingSystem returns "aws_sqs", for telemetry ([outbox.Describer]).
func (r *Receiver) MessagingSystem() string { return messagingSystem }

// DestinationName returns the name of the queue the Receiver reads.
func (r *Receiver) DestinationName(outbox.Message) string { return r.q.name }
