package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txoutbox/outbox"
)

// topicLimitTTL is how long a topic's max.message.bytes, read from the cluster, is trusted.
const topicLimitTTL = 5 * time.Minute

// Sender produces the relay's batches to Kafka; it implements outbox.Sender and is safe for
// concurrent use.
type Sender struct {
	cl          *kgo.Client
	cfg         *SenderConfig
	clientLimit func(topic string) int32 // kgo.ProducerBatchMaxBytesFn
	bufferLimit int                      // kgo.MaxBufferedBytes, 0 for none

	mu     sync.Mutex
	limits map[string]topicLimit // topic → its max.message.bytes
}

type topicLimit struct {
	bytes int // 0: unknown (the topic does not exist yet, or the lookup was refused)
	at    time.Time
}

// NewSender returns a sender producing through cl, which must be an idempotent producer
// (franz-go's default: acks from all in-sync replicas, idempotent writes). It validates
// cfg and cl's options and reports every problem at once.
//
// Per-key order needs a partitioner that hashes keys, as franz-go's default does; a
// kgo.RecordPartitioner that spreads keyed records (round robin) gives it up.
//
// cl stays the caller's: close it after the relay stopped. franz-go lingers 10ms by
// default before sending a partition's batch; the relay's batches are batches already, so
// kgo.ProducerLinger(0) saves those milliseconds on every Send.
func NewSender(cl *kgo.Client, cfg *SenderConfig) (*Sender, error) {
	if cl == nil {
		return nil, errors.New("outboxkafka: NewSender needs a *kgo.Client")
	}
	c := cfg.WithDefaults()
	err := c.validate()
	var errs []error
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		errs = append(errs, errors.New("the client disables idempotent writes (kgo.DisableIdempotentWrite): a retried produce request could write a record twice or out of order"))
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		errs = append(errs, errors.New("the client's kgo.RequiredAcks is not kgo.AllISRAcks(): a record acknowledged by the leader alone can be lost with it"))
	}
	if txn, _ := cl.OptValue(kgo.TransactionalID).(string); txn != "" {
		errs = append(errs, fmt.Errorf("the client is transactional (kgo.TransactionalID %q); the Sender produces outside transactions", txn))
	}
	if len(errs) > 0 {
		err = errors.Join(err, fmt.Errorf("outboxkafka: NewSender: %w", errors.Join(errs...)))
	}
	if err != nil {
		return nil, err
	}
	limit, _ := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	if limit == nil {
		limit = func(string) int32 { return 0 }
	}
	buffered, _ := cl.OptValue(kgo.MaxBufferedBytes).(int)
	return &Sender{cl: cl, cfg: c, clientLimit: limit, bufferLimit: buffered, limits: map[string]topicLimit{}}, nil
}

// Ping asks the cluster for its brokers (franz-go's Client.Ping: a metadata request to a
// broker the client knows, else a seed), sending nothing ([outbox.Pinger]): the relay
// calls it to learn that the cluster is back when it has nothing to send. A topic that does
// not exist is not noticed here but at the next send. It fails as a Send would, marked
// outbox.Unavailable for the cluster's faults: no broker reachable, a closed client, no
// answer before ctx's deadline.
func (s *Sender) Ping(ctx context.Context) error {
	if err := s.cl.Ping(ctx); err != nil {
		return markBrokerFault(fmt.Errorf("outboxkafka: ping: %w", err))
	}
	return nil
}

// TopicFor returns the topic m is produced to: its type's route, else the default Topic. An
// event of an unrouted type with no default topic fails permanently.
func (s *Sender) TopicFor(m outbox.Message) (string, error) {
	if t, ok := s.cfg.Routes[m.Type]; ok {
		return t, nil
	}
	if s.cfg.Topic != "" {
		return s.cfg.Topic, nil
	}
	return "", outbox.Permanent(fmt.Errorf("outboxkafka: message %s: no route for event type %q and no default Topic", m.ID, m.Type))
}

// MaxMessageBytes returns the largest record the sender produces to topic, as Kafka counts
// it: the lowest of the client's batch limit, the topic's max.message.bytes (when known)
// and SenderConfig.MaxMessageBytes, with the name of the limit that applies.
func (s *Sender) MaxMessageBytes(ctx context.Context, topic string) (int, string) {
	s.lookupLimits(ctx, []string{topic})
	return s.limit(topic)
}

func (s *Sender) limit(topic string) (int, string) {
	limit, name := int(s.clientLimit(topic)), "the client's kgo.ProducerBatchMaxBytes"
	s.mu.Lock()
	tl := s.limits[topic]
	s.mu.Unlock()
	if tl.bytes > 0 && (limit <= 0 || tl.bytes < limit) {
		limit, name = tl.bytes, fmt.Sprintf("topic %s's max.message.bytes", topic)
	}
	if s.bufferLimit > 0 && (limit <= 0 || s.bufferLimit < limit) {
		limit, name = s.bufferLimit, "the client's kgo.MaxBufferedBytes"
	}
	if s.cfg.MaxMessageBytes > 0 && (limit <= 0 || s.cfg.MaxMessageBytes < limit) {
		limit, name = s.cfg.MaxMessageBytes, "SenderConfig.MaxMessageBytes"
	}
	return limit, name
}

// lookupLimits reads max.message.bytes of the topics not looked up recently, in one
// DescribeConfigs request. Failures leave the limit unknown until the next try: the
// broker's own check still refuses an oversize record, as outbox.ErrTooLarge.
func (s *Sender) lookupLimits(ctx context.Context, topics []string) {
	now := time.Now()
	req := kmsg.NewPtrDescribeConfigsRequest()
	s.mu.Lock()
	for _, t := range topics {
		if tl, ok := s.limits[t]; ok && now.Sub(tl.at) < topicLimitTTL {
			continue
		}
		s.limits[t] = topicLimit{at: now} // one lookup at a time per topic
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType = kmsg.ConfigResourceTypeTopic
		r.ResourceName = t
		r.ConfigNames = []string{"max.message.bytes"}
		req.Resources = append(req.Resources, r)
	}
	s.mu.Unlock()
	if len(req.Resources) == 0 {
		return
	}
	resp, err := req.RequestWith(ctx, s.cl)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		for _, r := range req.Resources {
			delete(s.limits, r.ResourceName) // try again next Send
		}
		return
	}
	for _, r := range resp.Resources {
		if r.ErrorCode != 0 {
			delete(s.limits, r.ResourceName)
			continue
		}
		for _, c := range r.Configs {
			if c.Name == "max.message.bytes" && c.Value != nil {
				if n, err := strconv.Atoi(*c.Value); err == nil && n > 0 {
					s.limits[r.ResourceName] = topicLimit{bytes: n, at: now}
				}
			}
		}
	}
}

// Send produces msgs and waits until Kafka acknowledged each one (from all in-sync
// replicas), or ctx ends. It returns nil when every record was written, or an
// *outbox.BatchError naming those that were not. A message that cannot be routed, or whose
// record is over the size limit, is not produced and fails permanently (outbox.ErrTooLarge
// for size); the rest of the batch is produced all the same. A record whose outcome is
// unknown when ctx ends is reported failed: the relay sends it again, and the consumer's
// inbox absorbs a second copy. Failures that are the cluster's or the connection's are
// marked outbox.Unavailable (see the package's Outages section).
//
// Send keeps the order of a key's messages within a call: they are produced in the order
// given, to the key's partition, one at a time (the next once the broker acknowledged the
// one before; keys, and keyless messages, go side by side), and once one fails every later
// one of its key fails too without being sent. A message that fails before it is produced
// (no route, too large) fails the rest of its key in msgs unsent, and once ctx is done
// nothing more is produced. The Sender does not declare outbox.KeyOrderer all the same, so
// the relay sends it one message of each key per call (see the package doc, Key order).
func (s *Sender) Send(ctx context.Context, msgs []outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	failed := map[int]error{}
	var topics []string
	seen := map[string]bool{}
	for i, m := range msgs {
		topic, err := s.TopicFor(m)
		if err != nil {
			failed[i] = err
			continue
		}
		if recs[i], err = encode(m, topic, s.cfg.Source); err != nil {
			failed[i] = err
			continue
		}
		if !seen[topic] {
			seen[topic] = true
			topics = append(topics, topic)
		}
	}
	s.lookupLimits(ctx, topics)

	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(msgs)) // promises never block, even after Send returned
	pending := 0
	produce := func(i int) {
		pending++
		s.cl.Produce(ctx, recs[i], func(_ *kgo.Record, err error) { results <- result{i, err} })
	}
	// A key's records go one at a time: the next is produced once the broker acknowledged
	// the one before, so none is written after one of its key that failed. (franz-go fails
	// the records buffered for a partition after a failed batch, but not those produced
	// after the failure: those would be written.) Keys, and keyless records, go side by side.
	// notSent is the failure of message i, never produced because of cause; behind, because
	// the message of its key with the given ID failed before it.
	notSent := func(i int, cause error) error {
		return fmt.Errorf("outboxkafka: message %s not sent: %w", msgs[i].ID, cause)
	}
	behind := func(i int, first string) error {
		return notSent(i, fmt.Errorf("message %s of its key failed before it: %w", first, errKeyFailed))
	}
	var failedKeys map[string]string // key → the ID of its message that failed before being produced
	var inFlight map[string]bool     // keys with a record produced and not yet answered
	var waiting map[string][]int     // key → its records waiting for the one before
	for i, r := range recs {
		key := msgs[i].Key
		if first, ok := failedKeys[key]; ok && key != "" {
			failed[i] = behind(i, first)
			continue
		}
		if r != nil {
			if limit, name := s.limit(r.Topic); limit > 0 {
				if size := recordSize(r); size > limit {
					failed[i] = fmt.Errorf("outboxkafka: message %s is %d bytes as a record (value %d), over %s of %s: %w",
						msgs[i].ID, size, len(r.Value), name, formatBytes(limit), outbox.ErrTooLarge)
				}
			}
		}
		if err := ctx.Err(); err != nil && failed[i] == nil {
			failed[i] = notSent(i, err)
		}
		switch {
		case failed[i] != nil:
			if key != "" {
				if failedKeys == nil {
					failedKeys = map[string]string{}
				}
				failedKeys[key] = msgs[i].ID.String()
			}
		case key == "":
			produce(i)
		case inFlight[key]:
			if waiting == nil {
				waiting = map[string][]int{}
			}
			waiting[key] = append(waiting[key], i)
		default:
			if inFlight == nil {
				inFlight = map[string]bool{}
			}
			inFlight[key] = true
			produce(i)
		}
	}
	// next produces the record of key waiting behind the one just acknowledged, or fails
	// those waiting, unsent, with why.
	next := func(key string, why func(i int) error) {
		q := waiting[key]
		if len(q) == 0 {
			return
		}
		if why == nil {
			if err := ctx.Err(); err != nil {
				why = func(i int) error { return notSent(i, err) }
			}
		}
		if why == nil {
			waiting[key] = q[1:]
			produce(q[0])
			return
		}
		for _, i := range q {
			failed[i] = why(i)
		}
		delete(waiting, key)
	}
	done := make(map[int]bool, len(msgs))
	var refused []int // records the broker found too large
	for pending > 0 {
		select {
		case res := <-results:
			pending--
			done[res.i] = true
			switch {
			case res.err == nil:
			case errors.Is(res.err, kerr.MessageTooLarge), errors.Is(res.err, kerr.RecordListTooLarge):
				refused = append(refused, res.i)
			default:
				failed[res.i] = fmt.Errorf("outboxkafka: producing message %s to %s: %w", msgs[res.i].ID, recs[res.i].Topic, res.err)
			}
			if key := msgs[res.i].Key; key != "" {
				var why func(int) error
				if res.err != nil {
					first := msgs[res.i].ID.String()
					why = func(i int) error { return behind(i, first) }
				}
				next(key, why)
			}
		case <-ctx.Done():
			for key := range waiting {
				next(key, func(i int) error { return notSent(i, ctx.Err()) })
			}
			for i, r := range recs {
				if r != nil && !done[i] && failed[i] == nil {
					failed[i] = fmt.Errorf("outboxkafka: no acknowledgement for message %s on %s: %w", msgs[i].ID, r.Topic, ctx.Err())
				}
			}
			pending = 0 // leave the loop
		}
	}
	if len(refused) > 0 {
		s.judgeRefused(ctx, msgs, recs, refused, failed)
	}
	if len(failed) > 0 {
		for i, err := range failed {
			failed[i] = markBrokerFault(err)
		}
		return &outbox.BatchError{Failed: failed}
	}
	return nil
}

// judgeRefused decides, for records the broker refused as too large, which are too large
// themselves. The broker refuses a whole batch, so a small record can share the fate of a
// big one; and a refusal means the topic's limit changed since it was read. So the limits
// are read again: a record over them fails with outbox.ErrTooLarge, and the others fail for
// now (the relay sends them again).
func (s *Sender) judgeRefused(ctx context.Context, msgs []outbox.Message, recs []*kgo.Record, refused []int, failed map[int]error) {
	var topics []string
	s.mu.Lock()
	for _, i := range refused {
		if !slices.Contains(topics, recs[i].Topic) {
			delete(s.limits, recs[i].Topic)
			topics = append(topics, recs[i].Topic)
		}
	}
	s.mu.Unlock()
	s.lookupLimits(ctx, topics)
	for _, i := range refused {
		r, m := recs[i], msgs[i]
		if limit, name := s.limit(r.Topic); limit > 0 && recordSize(r) > limit {
			failed[i] = fmt.Errorf("outboxkafka: the broker refused message %s on %s: it is %d bytes as a record, over %s of %s: %w",
				m.ID, r.Topic, recordSize(r), name, formatBytes(limit), outbox.ErrTooLarge)
			continue
		}
		failed[i] = fmt.Errorf("outboxkafka: the broker refused message %s on %s as part of a batch over its size limit; sending it again: %w",
			m.ID, r.Topic, kerr.MessageTooLarge)
	}
}

// formatBytes writes n exactly, with a rounded binary unit when it helps.
func formatBytes(n int) string {
	const kib, mib = 1 << 10, 1 << 20
	switch {
	case n >= mib:
		return fmt.Sprintf("%d bytes (%.2f MiB)", n, float64(n)/mib)
	case n >= kib:
		return fmt.Sprintf("%d bytes (%.1f KiB)", n, float64(n)/kib)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

// errKeyFailed is the cause of a message not sent because an earlier one of its key failed.
var errKeyFailed = errors.New("an earlier message of the key failed")

var (
	_ outbox.Sender = (*Sender)(nil)
	_ outbox.Pinger = (*Sender)(nil)
)

// messagingSystem is Kafka's messaging.system in the OpenTelemetry conventions.
const messagingSystem = "kafka"

// MessagingSystem returns "kafka", for telemetry ([outbox.Describer]).
func (s *Sender) MessagingSystem() string { return messagingSystem }

// DestinationName returns the topic m is produced to ("" when it has no route).
func (s *Sender) DestinationName(m outbox.Message) string {
	if t, ok := s.cfg.Routes[m.Type]; ok {
		return t
	}
	return s.cfg.Topic
}
