package outboxkafka

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/internal/config"
)

const (
	// DefaultMaxWait is the default [ReceiverConfig].MaxWait.
	DefaultMaxWait = 5 * time.Second
	// DefaultMaxPendingPerPartition is the default [ReceiverConfig].MaxPendingPerPartition.
	DefaultMaxPendingPerPartition = 1000
	// DefaultRevokeTimeout is the default [ReceiverConfig].RevokeTimeout.
	DefaultRevokeTimeout = 10 * time.Second
	// DefaultMaxHeldBytes is the default [ReceiverConfig].MaxHeldBytes: 64 MiB.
	DefaultMaxHeldBytes = 64 << 20

	maxTopicLen = 249 // Kafka's limit on topic names
)

// SenderConfig configures a [Sender]. Nil means the defaults, which need Topic or Routes to
// be set, so a nil config is always invalid.
type SenderConfig struct {
	// Topic receives every event whose type has no entry in Routes. It may be empty when
	// Routes is set: an event of an unrouted type then fails permanently (the relay
	// dead-letters it) instead of going to a catch-all topic.
	Topic string
	// Routes sends events of a type to their own topic: event type → topic.
	Routes map[string]string
	// Source is the CloudEvents "source" attribute of every record. Default "/txoutbox".
	Source string
	// MaxMessageBytes caps a record's size as Kafka counts it against max.message.bytes
	// (a record batch holding only this record, before compression). The limits of the
	// client (kgo.ProducerBatchMaxBytes) and of each destination topic (its
	// max.message.bytes, read once per topic with DescribeConfigs) always apply; set this
	// lower to be stricter. Default 0: those limits alone.
	MaxMessageBytes int
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *SenderConfig) WithDefaults() *SenderConfig {
	out := SenderConfig{}
	if c != nil {
		out = *c
		out.Routes = maps.Clone(c.Routes)
	}
	config.Default(&out.Source, cloudevents.DefaultSource)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *SenderConfig) validate() error {
	var errs []error
	if c.Topic == "" && len(c.Routes) == 0 {
		errs = append(errs, errors.New("Topic is empty and there are no Routes: no event has a topic"))
	}
	if c.Topic != "" {
		if err := checkTopic(c.Topic); err != nil {
			errs = append(errs, fmt.Errorf("Topic: %w", err))
		}
	}
	for _, typ := range slices.Sorted(maps.Keys(c.Routes)) {
		if typ == "" {
			errs = append(errs, errors.New("Routes has an empty event type"))
			continue
		}
		if err := checkTopic(c.Routes[typ]); err != nil {
			errs = append(errs, fmt.Errorf("Routes[%q]: %w", typ, err))
		}
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is negative", c.MaxMessageBytes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxkafka: invalid SenderConfig: %w", errors.Join(errs...))
	}
	return nil
}

// ReceiverConfig configures a [Receiver]. Group and Topics are required.
type ReceiverConfig struct {
	// Group is the Kafka consumer group: receivers of one group share the topics'
	// partitions, and the group's committed offsets say where a restarted receiver
	// resumes. Required.
	Group string
	// Topics are the topics to consume. Required.
	Topics []string
	// MaxWait bounds one Receive: it returns no messages after waiting this long for one.
	// Default [DefaultMaxWait]; at least 10ms.
	MaxWait time.Duration
	// MaxPendingPerPartition caps the records of one partition held by the receiver and
	// not yet settled (handed out, waiting for a retry, or waiting behind an earlier
	// record of their key). At the cap the partition stops fetching until records settle,
	// so one stuck key cannot fill memory; other partitions are not affected. It also
	// bounds what a restart redelivers: the group's offset cannot pass the oldest
	// unsettled record. Default [DefaultMaxPendingPerPartition].
	MaxPendingPerPartition int
	// MaxHeldBytes bounds the records (key, value and headers) the receiver holds: fetched
	// and not yet acknowledged, whether handed out, waiting for a retry or waiting behind
	// an earlier record of their key. Receive fetches more only while they are under it,
	// so they stay within it plus one Receive's records; an acknowledged record stops
	// counting at once. The receiver keeps its own copy of each record, so a record it
	// holds does not pin the rest of the fetch it came in. What franz-go fetches ahead is
	// on top of this, bounded by kgo.FetchMaxBytes × kgo.MaxConcurrentFetches, which
	// NewReceiver sets to a quarter of MaxHeldBytes (at least 1 MiB) and 2 unless its opts
	// set them. Default [DefaultMaxHeldBytes] (64 MiB).
	MaxHeldBytes int
	// RevokeTimeout bounds how long a rebalance waits for handlers still running on
	// records of revoked partitions before it commits what is done and lets the partitions
	// go. A record still unsettled then is delivered again by its new owner. Keep it below
	// the group's rebalance timeout (kgo default 60s). Default [DefaultRevokeTimeout].
	RevokeTimeout time.Duration
	// Logger receives commit failures and rebalances. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *ReceiverConfig) WithDefaults() *ReceiverConfig {
	out := ReceiverConfig{}
	if c != nil {
		out = *c
		out.Topics = slices.Clone(c.Topics)
	}
	config.Default(&out.MaxWait, DefaultMaxWait)
	config.Default(&out.MaxPendingPerPartition, DefaultMaxPendingPerPartition)
	config.Default(&out.RevokeTimeout, DefaultRevokeTimeout)
	config.Default(&out.MaxHeldBytes, DefaultMaxHeldBytes)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *ReceiverConfig) validate() error {
	var errs []error
	if c.Group == "" {
		errs = append(errs, errors.New("Group is empty"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("Topics is empty"))
	}
	for i, t := range c.Topics {
		if err := checkTopic(t); err != nil {
			errs = append(errs, fmt.Errorf("Topics[%d]: %w", i, err))
		}
	}
	if c.MaxWait < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("MaxWait %v is under 10ms", c.MaxWait))
	}
	if c.MaxPendingPerPartition < 1 {
		errs = append(errs, fmt.Errorf("MaxPendingPerPartition %d is below 1", c.MaxPendingPerPartition))
	}
	if c.MaxHeldBytes < 1 {
		errs = append(errs, fmt.Errorf("MaxHeldBytes %d is below 1", c.MaxHeldBytes))
	}
	if c.RevokeTimeout < 0 {
		errs = append(errs, fmt.Errorf("RevokeTimeout %v is negative", c.RevokeTimeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxkafka: invalid ReceiverConfig: %w", errors.Join(errs...))
	}
	return nil
}

// checkTopic reports why name is not a valid Kafka topic name: 1–249 of a-z A-Z 0-9 . _ -,
// and not "." or "..".
func checkTopic(name string) error {
	if name == "" {
		return errors.New("topic name is empty")
	}
	if len(name) > maxTopicLen {
		return fmt.Errorf("topic name %.20q… is %d characters, over Kafka's %d", name, len(name), maxTopicLen)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("topic name %q is not allowed", name)
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("topic name %q has %q at byte %d (allowed: a-z A-Z 0-9 . _ -)", name, c, i)
		}
	}
	return nil
}
