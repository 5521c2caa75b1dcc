package outboxrabbitmq

import (
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
)

// FuzzDecode: any delivery (headers, content type, message-id, body) decodes to an event or
// to an *outbox.MalformedError that keeps every header, the content type, the message-id
// and the body byte for byte, and names the message, never a panic; a decoded event
// written by our encoder reads back as the same event. Seeds: our own messages and the
// CloudEvents JavaScript SDK's (outboxtest/testdata).
func FuzzDecode(f *testing.F) {
	m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: "a.b", Key: "k", ContentType: "application/json",
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"},
		Body:    []byte(`{"n":1}`), CreatedAt: time.Unix(1, 0).UTC()}
	p, err := encode(m, "/fuzz")
	if err != nil {
		f.Fatal(err)
	}
	own := map[string]string{}
	for k, v := range p.Headers {
		own[k] = v.(string)
	}
	f.Add(outboxtest.HeaderLines(own), p.ContentType, p.MessageId, p.Body)
	for _, fm := range outboxtest.ForeignMessages() {
		f.Add(outboxtest.HeaderLines(fm.Headers), "", "", fm.Body)
	}
	f.Add("", "", "", []byte("not a CloudEvent"))
	f.Add("cloudEvents:id\t1\ncloudEvents_id\t2\nce-id\t3\nCE_TYPE\tt\n", "application/json", "m-1", []byte(`{"specversion":"1.0"}`))
	f.Fuzz(func(t *testing.T, lines, contentType, messageID string, body []byte) {
		d := &amqp.Delivery{Headers: amqp.Table{}, ContentType: contentType, MessageId: messageID, DeliveryTag: 9, Body: body}
		for _, h := range outboxtest.ParseHeaderLines(lines) {
			d.Headers[h[0]] = h[1]
		}
		got, err := decode(d, "queue q")
		if err != nil {
			raw := map[string]string{}
			for k, v := range d.Headers {
				raw[k] = v.(string)
			}
			if contentType != "" {
				raw["content-type"] = contentType
			}
			if messageID != "" {
				raw["message-id"] = messageID
			}
			id := messageID
			if id == "" {
				id = "queue q delivery tag 9"
			}
			if err := outboxtest.CheckMalformed(err, raw, body, id); err != nil {
				t.Fatal(err)
			}
			return
		}
		if got.ID == uuid.Nil || got.Type == "" {
			t.Fatalf("decoded an event without ID or type: %+v", got)
		}
		p, err := encode(got, "/fuzz")
		if err != nil {
			return // a header that is not UTF-8 cannot be written
		}
		back, err := decode(&amqp.Delivery{Headers: p.Headers, ContentType: p.ContentType, MessageId: p.MessageId, Body: p.Body}, "queue q")
		if err != nil || back.ID != got.ID || back.Type != got.Type || back.Key != got.Key || !maps.Equal(back.Headers, got.Headers) {
			t.Fatalf("written again: read back %+v, %v; want %+v", back, err, got)
		}
	})
}
