package outboxrabbitmq

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

// PropertyPrefix prefixes the CloudEvents attributes among a message's application
// properties (AMQP 0-9-1 headers): "cloudEvents_id", "cloudEvents_type"… The CloudEvents AMQP
// binding allows "cloudEvents:" and "cloudEvents_" and says the latter SHOULD be preferred,
// since JMS message selectors (and other tools that take header names as identifiers)
// cannot name a ':'; datacontenttype travels as the content-type property instead.
const PropertyPrefix = "cloudEvents_"

// colonPropertyPrefix is the binding's other spelling ("cloudEvents:id"), which earlier
// versions of this transport and other producers write; receivers read it too.
const colonPropertyPrefix = "cloudEvents:"

// AttemptsHeader counts the deliveries a message had before a [Receiver] sent it through a
// retry queue; the Receiver adds the queue's own delivery count to it for Attempt.
const AttemptsHeader = "txoutbox-attempts"

// encode turns m into a persistent AMQP publishing in CloudEvents binary mode: the
// attributes as cloudEvents_-prefixed headers, datacontenttype as content-type, the event
// ID (Message.DedupID) as message-id, the event type as the type property.
func encode(m outbox.Message, source string) (amqp.Publishing, error) {
	p := amqp.Publishing{
		Headers:      make(amqp.Table, 8+len(m.Headers)),
		DeliveryMode: amqp.Persistent,
		MessageId:    m.DedupID(),
		Type:         m.Type,
		Timestamp:    m.CreatedAt, // whole seconds on the wire; cloudEvents_time is exact
		Body:         m.Body,
	}
	err := cloudevents.EachBinary(m, source, func(k, v string) {
		if k == cloudevents.ContentTypeHeader {
			p.ContentType = v
			return
		}
		p.Headers[PropertyPrefix+strings.TrimPrefix(k, cloudevents.HeaderPrefix)] = v
	})
	if err != nil {
		return amqp.Publishing{}, outbox.Permanent(fmt.Errorf("outboxrabbitmq: encoding message %s: %w", m.ID, err))
	}
	return p, nil
}

// headerBytes estimates the size of p's content header frame: the properties the sender
// sets and the headers table as AMQP encodes it (long strings). It must fit in one frame.
func headerBytes(p *amqp.Publishing) int {
	n := 64 + len(p.ContentType) + len(p.MessageId) + len(p.Type)
	for k, v := range p.Headers {
		n += 1 + len(k) + 1 + 4
		if s, ok := v.(string); ok {
			n += len(s)
		}
	}
	return n
}

// decode rebuilds the event of a delivery: attributes as "cloudEvents_" (or
// "cloudEvents:") headers as the AMQP binding says, or in another binding's style ("ce-",
// "ce_", bare traceparent…) as a bridge forwards them, datacontenttype as the content-type
// property; or the whole event in structured mode. A message that is not a valid event
// gives an *outbox.MalformedError keeping the body and headers as received (content-type
// and message-id among them) and what could be read. Its broker message ID is the
// message-id property, or, without one, where and the delivery tag.
func decode(d *amqp.Delivery, where string) (outbox.Message, error) {
	h := make(map[string]string, len(d.Headers)+1)
	var binding []string
	for k, v := range d.Headers {
		if strings.HasPrefix(k, PropertyPrefix) || strings.HasPrefix(k, colonPropertyPrefix) {
			binding = append(binding, k)
			continue
		}
		h[k] = attributeString(v)
	}
	// The binding's own names win over any other style, and "cloudEvents_" over the colon
	// spelling: ':' sorts before '_', so in order the underscore names come last and stay.
	slices.Sort(binding)
	for _, k := range binding {
		name := strings.TrimPrefix(strings.TrimPrefix(k, PropertyPrefix), colonPropertyPrefix)
		h[cloudevents.HeaderPrefix+name] = attributeString(d.Headers[k])
	}
	if d.ContentType != "" {
		h[cloudevents.ContentTypeHeader] = d.ContentType
	}
	m, err := cloudevents.FromBinary(h, d.Body)
	if err == nil {
		return m, nil
	}
	raw := make(map[string]string, len(d.Headers)+2)
	for k, v := range d.Headers {
		raw[k] = attributeString(v)
	}
	if d.ContentType != "" {
		raw["content-type"] = d.ContentType
	}
	if d.MessageId != "" {
		raw["message-id"] = d.MessageId
	}
	id := d.MessageId
	if id == "" {
		id = fmt.Sprintf("%s delivery tag %d", where, d.DeliveryTag)
	}
	me := cloudevents.Malformed(err, id, raw, d.Body)
	me.Err = fmt.Errorf("outboxrabbitmq: message at %s (delivery tag %d): %w", where, d.DeliveryTag, me.Err)
	return me.Partial, me
}

// attributeString is an attribute value in its CloudEvents canonical string form: the
// binding lets senders use native AMQP types (timestamp, long, boolean, binary).
func attributeString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case []byte:
		return base64.StdEncoding.EncodeToString(v)
	case bool:
		return strconv.FormatBool(v)
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64:
		return fmt.Sprint(v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}
