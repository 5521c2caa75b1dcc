package outboxkafka

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
)

// Encode returns m as a Sender produces it to topic, with the default source.
func Encode(m outbox.Message, topic string) *kgo.Record {
	r, err := encode(m, topic, "/txoutbox")
	if err != nil {
		panic(err)
	}
	return r
}

// RecordSize is the size the Sender counts for r against max.message.bytes.
func RecordSize(r *kgo.Record) int { return recordSize(r) }
