package outboxkafka

import (
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

const (
	// HeaderPrefix prefixes CloudEvents attributes in record headers, as the CloudEvents
	// Kafka protocol binding says ("ce_id", "ce_type"…; HTTP and NATS use "ce-").
	HeaderPrefix = "ce_"
	// ContentTypeHeader carries the datacontenttype attribute.
	ContentTypeHeader = cloudevents.ContentTypeHeader
	// DedupIDHeader carries outbox.Message.DedupID: the event ID, extended for a replayed
	// dead letter. Kafka does not deduplicate by it (the idempotent producer only drops
	// its own retried requests); it is there for consumers and for tracing a record back
	// to its outbox row.
	DedupIDHeader = "txoutbox-dedup-id"

	// recordBatchOverhead is the size of a v2 record batch without records: what Kafka
	// measures against max.message.bytes is a batch, so a record alone costs this more.
	recordBatchOverhead = 61
)

// kafkaNames maps the wire package's binary header names to the Kafka binding's, for the
// attributes every message has; others are renamed on the fly.
var kafkaNames = func() map[string]string {
	m := map[string]string{}
	for _, a := range []string{"specversion", "id", "type", "source", "time", "partitionkey", "txheaders", "traceparent", "tracestate"} {
		m[cloudevents.HeaderPrefix+a] = HeaderPrefix + a
	}
	return m
}()

// encode returns m as a record for topic in CloudEvents binary mode: attributes as "ce_"
// headers, content-type, the dedup ID header, m.Key as the record key and m.Body as the
// value (not copied).
func encode(m outbox.Message, topic, source string) (*kgo.Record, error) {
	hs := make([]kgo.RecordHeader, 0, 9+len(m.Headers))
	err := cloudevents.EachBinary(m, source, func(k, v string) {
		if strings.HasPrefix(k, cloudevents.HeaderPrefix) {
			if n, ok := kafkaNames[k]; ok {
				k = n
			} else {
				k = HeaderPrefix + k[len(cloudevents.HeaderPrefix):]
			}
		}
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
	})
	if err != nil {
		return nil, outbox.Permanent(fmt.Errorf("outboxkafka: encoding message %s: %w", m.ID, err))
	}
	hs = append(hs, kgo.RecordHeader{Key: DedupIDHeader, Value: []byte(m.DedupID())})
	r := &kgo.Record{Topic: topic, Value: m.Body, Headers: hs}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	return r, nil
}

// recordSize is r's size as Kafka counts it against max.message.bytes: a v2 record batch
// holding r alone, uncompressed.
func recordSize(r *kgo.Record) int {
	n := 1 + 1 + 1 // attributes, timestamp delta 0, offset delta 0
	if r.Key == nil {
		n += varintLen(-1)
	} else {
		n += varintLen(int64(len(r.Key))) + len(r.Key)
	}
	n += varintLen(int64(len(r.Value))) + len(r.Value)
	n += varintLen(int64(len(r.Headers)))
	for _, h := range r.Headers {
		n += varintLen(int64(len(h.Key))) + len(h.Key) + varintLen(int64(len(h.Value))) + len(h.Value)
	}
	return recordBatchOverhead + varintLen(int64(n)) + n
}

// varintLen is the length of v as a zig-zag varint, Kafka's encoding of record fields.
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// brokerID names a record in errors and dead letters: topic/partition/offset.
func brokerID(r *kgo.Record) string {
	return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
}

// decode rebuilds the message r carries: in binary mode with "ce_" headers (or "ce-", in
// any case), or in structured mode; the record key is the partitionkey when no header
// gives one. A record that is not a valid event gives an *outbox.MalformedError keeping
// the raw record (headers, a repeated one's last value, and value) and what could be read.
func decode(r *kgo.Record) (outbox.Message, error) {
	h := make(map[string]string, len(r.Headers))
	for _, rh := range r.Headers {
		h[rh.Key] = string(rh.Value)
	}
	m, err := cloudevents.FromBinary(h, r.Value)
	if err != nil {
		me := cloudevents.Malformed(err, brokerID(r), h, r.Value)
		me.Err = fmt.Errorf("outboxkafka: record %s: %w", brokerID(r), me.Err)
		if me.Partial.Key == "" {
			me.Partial.Key = string(r.Key)
		}
		return outbox.Message{}, me
	}
	if m.Key == "" && len(r.Key) > 0 {
		// The binding maps the record key to the partitionkey extension: a foreign
		// producer's keyed event keeps its per-key order in the consumer.
		m.Key = string(r.Key)
	}
	return m, nil
}
