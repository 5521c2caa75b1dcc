package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
)

// Topology is a stream and a durable pull consumer for [Provision]. Production setups
// usually declare them in their infrastructure code instead; these fields are the ones
// txoutbox cares about.
type Topology struct {
	// Stream names the stream. Required.
	Stream string
	// Subjects are the subjects the stream captures. Default: everything under
	// [DefaultSubjectPrefix] ("events.>").
	Subjects []string
	// Consumer names the durable pull consumer. Default: the stream's name.
	Consumer string
	// Ordered makes the consumer hand out one message at a time (MaxAckPending 1), in
	// stream order, redeliveries included: per-key order holds ([Features] reports FIFO),
	// at the cost of all parallelism on the consumer side. Default false: up to 1000
	// messages in flight, and a message that is retried is overtaken by later ones.
	Ordered bool
	// Duplicates is the stream's dedup window for Nats-Msg-Id. Keep it longer than the
	// relay's Lease plus SendTimeout. Default 2m (the server's default).
	Duplicates time.Duration
	// AckWait is how long a delivered message may stay unacknowledged before the server
	// delivers it again. Default 30s.
	AckWait time.Duration
	// MaxMsgSize caps a stored message (headers and body) below the server's max_payload;
	// pass the same value as SenderConfig.MaxMessageBytes. Default 0: no stream limit.
	MaxMsgSize int32
	// Storage is file (the default) or memory storage.
	Storage jetstream.StorageType
}

// Provision creates the stream and the consumer of t, or updates them to t if they exist,
// and returns both. It is meant for tests, examples and small deployments.
func Provision(ctx context.Context, js jetstream.JetStream, t Topology) (jetstream.Stream, jetstream.Consumer, error) {
	var errs []error
	if js == nil {
		errs = append(errs, errors.New("no JetStream context"))
	}
	if t.Stream == "" {
		errs = append(errs, errors.New("Topology.Stream is empty"))
	}
	if t.Duplicates < 0 || t.AckWait < 0 || t.MaxMsgSize < 0 {
		errs = append(errs, fmt.Errorf("negative Duplicates (%v), AckWait (%v) or MaxMsgSize (%d)", t.Duplicates, t.AckWait, t.MaxMsgSize))
	}
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("outboxnats: Provision: %w", errors.Join(errs...))
	}
	if len(t.Subjects) == 0 {
		t.Subjects = []string{DefaultSubjectPrefix + ".>"}
	}
	if t.Consumer == "" {
		t.Consumer = t.Stream
	}
	maxMsgSize := int32(-1)
	if t.MaxMsgSize > 0 {
		maxMsgSize = t.MaxMsgSize
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       t.Stream,
		Subjects:   t.Subjects,
		Storage:    t.Storage,
		Duplicates: t.Duplicates,
		MaxMsgSize: maxMsgSize,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("outboxnats: creating stream %s: %w", t.Stream, err)
	}
	maxAckPending := 1000
	if t.Ordered {
		maxAckPending = 1
	}
	consumer, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       t.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.AckWait,
		MaxDeliver:    -1, // the consumer runtime dead-letters after its MaxAttempts
		MaxAckPending: maxAckPending,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("outboxnats: creating consumer %s on stream %s: %w", t.Consumer, t.Stream, err)
	}
	return stream, consumer, nil
}

// Features reports what a [Sender] publishing into a stream and a [Receiver] reading
// through one of its consumers promise together, from the stream's and the consumer's
// configuration (stream.CachedInfo().Config, consumer.CachedInfo().Config):
//
//   - FIFO only when the consumer has MaxAckPending 1 and explicit acks: JetStream keeps
//     publish order in the stream, but a consumer with several messages in flight lets
//     later messages overtake one that is being retried.
//   - Dedup when the stream has a Duplicates window (the server's default is 2 minutes).
//   - Batch and Delay always (async publish; nak with delay).
//   - MaxMessageBytes: the sender's limit, lowered to the stream's MaxMsgSize if set.
func Features(s *Sender, stream jetstream.StreamConfig, consumer jetstream.ConsumerConfig) outbox.TransportFeatures {
	limit := s.MaxMessageBytes()
	if stream.MaxMsgSize > 0 && (limit == 0 || int(stream.MaxMsgSize) < limit) {
		limit = int(stream.MaxMsgSize)
	}
	return outbox.TransportFeatures{
		FIFO:            consumer.MaxAckPending == 1 && consumer.AckPolicy == jetstream.AckExplicitPolicy,
		Dedup:           stream.Duplicates > 0,
		Batch:           true,
		Delay:           true,
		MaxMessageBytes: limit,
	}
}
