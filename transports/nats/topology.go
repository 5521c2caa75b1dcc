package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	// FilterSubjects, when set, makes the consumer receive only the stream's messages on
	// these subjects (wildcards allowed): a consumer reading a stream shared with other
	// teams' event types then never sees theirs, and needs no UnknownTypes policy for them.
	// [SubjectsFor] builds them from the event types the consumer handles, routed as the
	// Sender routes them. One subject works on every nats-server with JetStream; several
	// need nats-server 2.10 or later, and Provision refuses them on an older server (which
	// would ignore them and deliver everything). Default: every subject of the stream.
	FilterSubjects []string
	// Ordered makes the consumer hand out one message at a time (MaxAckPending 1), in
	// stream order, redeliveries included: per-key order holds, at the cost of all
	// parallelism on the consumer side (a consumer with several messages in flight lets
	// later messages overtake one that is being retried). Default false: up to 1000
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
	for _, f := range t.FilterSubjects {
		if err := checkFilter(f); err != nil {
			errs = append(errs, fmt.Errorf("FilterSubjects %q: %w", f, err))
		}
	}
	if len(t.FilterSubjects) > 1 && js != nil {
		if v := js.Conn().ConnectedServerVersion(); !serverAtLeast(v, 2, 10) {
			errs = append(errs, fmt.Errorf("%d FilterSubjects need nats-server 2.10 or later, and this one is %s (which would deliver every subject): use one subject, e.g. a wildcard", len(t.FilterSubjects), v))
		}
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
	cc := jetstream.ConsumerConfig{
		Durable:       t.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.AckWait,
		MaxDeliver:    -1, // the consumer runtime dead-letters after its MaxAttempts
		MaxAckPending: maxAckPending,
	}
	if len(t.FilterSubjects) == 1 {
		cc.FilterSubject = t.FilterSubjects[0] // understood by servers before 2.10 too
	} else {
		cc.FilterSubjects = t.FilterSubjects
	}
	consumer, err := stream.CreateOrUpdateConsumer(ctx, cc)
	if err != nil {
		return nil, nil, fmt.Errorf("outboxnats: creating consumer %s on stream %s: %w", t.Consumer, t.Stream, err)
	}
	return stream, consumer, nil
}

// SubjectsFor returns the subjects a [Sender] configured with cfg (nil: the defaults)
// publishes the given event types to — SubjectPrefix and the type, or the subject
// cfg.Subjects names for it — without repeats: the FilterSubjects of a consumer that
// handles those types. A cfg routing by a Subject function is refused, since its subjects
// depend on each message rather than on the type; list them yourself.
//
// Event types come from the payload types a consumer handles: outbox.EventTypeOf[T]().
func SubjectsFor(cfg *SenderConfig, eventTypes ...string) ([]string, error) {
	c := cfg.WithDefaults()
	if c.Subject != nil {
		return nil, errors.New("outboxnats: SubjectsFor: the SenderConfig routes by a Subject function, whose subjects cannot be known from event types")
	}
	s := &Sender{cfg: c, prefix: c.SubjectPrefix + "."}
	var out []string
	var errs []error
	for _, typ := range eventTypes {
		subj := s.subject(outbox.Message{Type: typ})
		if err := checkSubject(subj); err != nil {
			errs = append(errs, fmt.Errorf("event type %q gives subject %q, which %w", typ, subj, err))
			continue
		}
		if !slices.Contains(out, subj) {
			out = append(out, subj)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("outboxnats: SubjectsFor: %w", errors.Join(errs...))
	}
	return out, nil
}

// checkFilter reports why f cannot filter a consumer: a subject whose tokens may be the
// wildcards "*", and ">" as the last.
func checkFilter(f string) error {
	if f == "" {
		return errors.New("is empty")
	}
	toks := strings.Split(f, ".")
	for i, tok := range toks {
		switch {
		case tok == "":
			return errors.New("has an empty token (a leading, trailing or double dot)")
		case tok == ">" && i != len(toks)-1:
			return errors.New(`has ">" before its last token`)
		case strings.ContainsAny(tok, " \t\r\n"):
			return errors.New("contains white space")
		}
	}
	return nil
}

// serverAtLeast reports whether the server version v ("2.10.3", "v2.9.10-beta") is at
// least major.minor; an unreadable version counts as new enough for the server to judge.
func serverAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return ma > major || ma == major && mi >= minor
}
