package outboxsqs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/txoutbox/outbox"
)

// batchEntries is the most messages one SendMessageBatch call takes.
const batchEntries = 10

// Sender sends outbox messages to SQS queues; it is the relay's [outbox.Sender]. It is safe
// for concurrent use.
type Sender struct {
	client SenderAPI
	cfg    *SenderConfig
	def    *queue            // QueueURL's queue; nil when unset
	routes map[string]*queue // event type → queue
	ping   *queue            // the queue Ping looks at
}

// NewSender returns a Sender over client (normally an *sqs.Client). cfg is validated here:
// every problem in it is reported at once.
func NewSender(client SenderAPI, cfg *SenderConfig) (*Sender, error) {
	c := cfg.WithDefaults()
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("outboxsqs: NewSender needs a client (an *sqs.Client)"))
	}
	if err := c.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s := &Sender{client: client, cfg: c, routes: make(map[string]*queue, len(c.Routes))}
	if c.QueueURL != "" {
		s.def, _ = parseQueue(c.QueueURL)
	}
	for typ, u := range c.Routes {
		s.routes[typ], _ = parseQueue(u)
	}
	s.ping = s.def
	for _, typ := range slices.Sorted(maps.Keys(s.routes)) {
		if s.ping == nil {
			s.ping = s.routes[typ]
		}
	}
	return s, nil
}

// MaxMessageBytes returns SenderConfig.MaxMessageBytes, the largest message (body and
// attributes, as SQS counts them) the Sender sends: claimcheck.NewSender takes it as the
// size above which a body goes to the blob store.
func (s *Sender) MaxMessageBytes() int { return s.cfg.MaxMessageBytes }

// Ping asks SQS for one attribute of a queue the Sender sends to (QueueURL's, else the
// first route's by event type), sending nothing ([outbox.Pinger]): the relay calls it to
// learn that SQS is back when it has nothing to send. It fails as a Send would, marked
// outbox.Unavailable for SQS's faults: no answer before ctx's deadline, throttling,
// credentials refused, a queue that does not exist.
func (s *Sender) Ping(ctx context.Context) error {
	_, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       &s.ping.url,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	}, withPlainBody)
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%w)", ctxErr, err)
	}
	return markBrokerFault(fmt.Errorf("outboxsqs: pinging queue %s: %w", s.ping.name, err))
}

// call is one SendMessageBatch request: entries of one queue, with the batch index of each.
type call struct {
	q       *queue
	entries []types.SendMessageBatchRequestEntry
	idx     []int
	bytes   int
}

// Send sends msgs with SendMessageBatch, up to 10 per call and MaxConcurrentCalls calls at
// once. It returns nil when SQS accepted every message, an *outbox.BatchError naming the
// ones it did not, or the error of the only call when that call failed whole. Messages over
// MaxMessageBytes, of an unrouted type, or that SQS cannot carry fail permanently without
// being sent. Failures that are SQS's, the endpoint's or the connection's are marked
// outbox.Unavailable (see the package's Outages section).
func (s *Sender) Send(ctx context.Context, msgs []outbox.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	failed := map[int]error{}
	calls := s.plan(msgs, failed)
	unsendable := len(failed)
	var (
		mu      sync.Mutex
		lastErr error // the call error, when exactly one call failed whole
	)
	record := func(c *call, err error, perEntry map[int]error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			lastErr = err
			for _, i := range c.idx {
				failed[i] = err
			}
		}
		for i, e := range perEntry {
			failed[i] = e
		}
	}
	if len(calls) == 1 {
		perEntry, err := s.send(ctx, calls[0], msgs)
		record(calls[0], err, perEntry)
	} else {
		sem := make(chan struct{}, s.cfg.MaxConcurrentCalls)
		var wg sync.WaitGroup
		for _, c := range calls {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				record(c, fmt.Errorf("outboxsqs: not sent to %s: %w", c.q.name, ctx.Err()), nil)
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				perEntry, err := s.send(ctx, c, msgs)
				record(c, err, perEntry)
			})
		}
		wg.Wait()
	}
	switch {
	case len(failed) == 0:
		return nil
	case len(calls) == 1 && unsendable == 0 && lastErr != nil:
		return markBrokerFault(lastErr)
	}
	for i, err := range failed {
		failed[i] = markBrokerFault(err)
	}
	return &outbox.BatchError{Failed: failed}
}

// plan encodes msgs and packs them into calls per queue; messages that cannot be sent are
// put in failed.
func (s *Sender) plan(msgs []outbox.Message, failed map[int]error) []*call {
	var calls []*call
	open := map[*queue]*call{}
	for i, m := range msgs {
		q := s.def
		if r, ok := s.routes[m.Type]; ok {
			q = r
		}
		if q == nil {
			failed[i] = outbox.Permanent(fmt.Errorf("outboxsqs: message %s has event type %q, which has no route, and SenderConfig.QueueURL is empty", m.ID, m.Type))
			continue
		}
		w, err := encode(m, s.cfg.Source)
		if err != nil {
			failed[i] = outbox.Permanent(fmt.Errorf("outboxsqs: %w", err))
			continue
		}
		if w.size > s.cfg.MaxMessageBytes {
			failed[i] = fmt.Errorf("outboxsqs: message %s is %s (%d bytes of body and attributes), over the SQS limit of %s (%d bytes): %w",
				m.ID, formatSize(w.size), w.size, formatSize(s.cfg.MaxMessageBytes), s.cfg.MaxMessageBytes, outbox.ErrTooLarge)
			continue
		}
		e := types.SendMessageBatchRequestEntry{
			Id:                ptr(strconv.Itoa(i)),
			MessageBody:       ptr(w.body),
			MessageAttributes: w.attrs,
		}
		if q.fifo {
			e.MessageDeduplicationId = ptr(m.DedupID())
			switch {
			case m.Key != "":
				e.MessageGroupId = ptr(groupID(m.Key))
			case s.cfg.KeylessGroupID != "":
				e.MessageGroupId = ptr(s.cfg.KeylessGroupID)
			default:
				e.MessageGroupId = e.MessageDeduplicationId
			}
		}
		c := open[q]
		if c == nil || len(c.entries) == batchEntries || c.bytes+w.size > s.cfg.MaxMessageBytes {
			c = &call{q: q}
			open[q] = c
			calls = append(calls, c)
		}
		c.entries = append(c.entries, e)
		c.idx = append(c.idx, i)
		c.bytes += w.size
	}
	return calls
}

// send makes one SendMessageBatch call. It returns the call's error when the call failed
// whole, or the errors of the entries SQS rejected.
func (s *Sender) send(ctx context.Context, c *call, msgs []outbox.Message) (map[int]error, error) {
	out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &c.q.url, Entries: c.entries}, withPlainBody)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w (%w)", ctxErr, err)
		}
		return nil, fmt.Errorf("outboxsqs: sending %d message(s) to %s: %w", len(c.entries), c.q.name, err)
	}
	perEntry := map[int]error{}
	answered := make(map[string]bool, len(c.entries))
	for _, ok := range out.Successful {
		answered[deref(ok.Id)] = true
	}
	for _, f := range out.Failed {
		id := deref(f.Id)
		i, err := strconv.Atoi(id)
		if err != nil || !slices.Contains(c.idx, i) {
			continue // not an entry of ours: the ones we sent are checked below
		}
		answered[id] = true
		perEntry[i] = entryError(msgs[i], c.q, f)
	}
	for _, i := range c.idx {
		if !answered[strconv.Itoa(i)] {
			perEntry[i] = fmt.Errorf("outboxsqs: SQS returned no result for message %s sent to %s", msgs[i].ID, c.q.name)
		}
	}
	return perEntry, nil
}

// permanentCodes are SendMessageBatch entry failures caused by the message itself.
var permanentCodes = map[string]bool{
	"InvalidMessageContents": true,
	"InvalidAttributeName":   true,
	"InvalidAttributeValue":  true,
	"InvalidParameterValue":  true,
	"MessageTooLong":         true,
}

// entryError describes an entry SQS rejected: permanent when the message itself is at
// fault, outbox.ErrTooLarge when it was too large for the queue, outbox.Unavailable when
// SQS failed it for reasons of its own (a server fault, throttling, KMS).
func entryError(m outbox.Message, q *queue, f types.BatchResultErrorEntry) error {
	code, text := deref(f.Code), deref(f.Message)
	err := &smithy.GenericAPIError{Code: code, Message: text, Fault: smithy.FaultServer}
	if f.SenderFault {
		err.Fault = smithy.FaultClient
	}
	if code == "MessageTooLong" || strings.Contains(text, "shorter than") {
		return fmt.Errorf("outboxsqs: queue %s rejected message %s as too large (its MaximumMessageSize is below SenderConfig.MaxMessageBytes): %w: %w", q.name, m.ID, outbox.ErrTooLarge, err)
	}
	wrapped := fmt.Errorf("outboxsqs: queue %s rejected message %s: %w", q.name, m.ID, err)
	switch {
	case f.SenderFault && permanentCodes[code]:
		return outbox.Permanent(wrapped)
	case isBrokerEntryFault(f):
		return outbox.Unavailable(wrapped)
	}
	return wrapped
}

var (
	_ outbox.Sender = (*Sender)(nil)
	_ outbox.Pinger = (*Sender)(nil)
)

// MessagingSystem returns "aws_sqs", for telemetry ([outbox.Describer]).
func (s *Sender) MessagingSystem() string { return messagingSystem }

// DestinationName returns the name of the queue m is sent to ("" when it has no route).
func (s *Sender) DestinationName(m outbox.Message) string {
	if q, ok := s.routes[m.Type]; ok {
		return q.name
	}
	if s.def != nil {
		return s.def.name
	}
	return ""
}
