package outboxtest

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

// ForeignMessage is a broker message written by another CloudEvents producer.
type ForeignMessage struct {
	// Name identifies the message in test output.
	Name string
	// About says what is special about it.
	About string
	// Headers are the message's headers or attributes: in binary mode the CloudEvents
	// attributes ("ce-id", "ce_id", "Ce-Id"…, "content-type") and any other header; in
	// structured mode only "content-type: application/cloudevents+json".
	Headers map[string]string
	// Body is the event's data in binary mode, the whole event as JSON in structured mode.
	Body []byte
}

// Structured reports whether m carries its event in structured mode, so that a broker
// without headers carries it as its Body alone.
func (m ForeignMessage) Structured() bool {
	if len(m.Headers) != 1 {
		return false
	}
	for k, v := range m.Headers {
		return strings.EqualFold(k, cloudevents.ContentTypeHeader) && strings.HasPrefix(strings.ToLower(v), cloudevents.StructuredContentType)
	}
	return false
}

// foreignGolden is the output of the official CloudEvents JavaScript SDK, written by
// scripts/services/foreign-cloudevents.mjs.
//
//go:embed testdata/cloudevents-js.json
var foreignGolden []byte

// ForeignMessages returns the messages the conformance suite sends as a foreign producer:
// CloudEvents written by the official CloudEvents JavaScript SDK in binary and structured
// mode (testdata/cloudevents-js.json). They also make a good seed corpus for a transport's
// decoder fuzz test.
func ForeignMessages() []ForeignMessage {
	var golden struct {
		Messages []struct {
			Name, About string
			Headers     map[string]string
			Body        string
		}
	}
	if err := json.Unmarshal(foreignGolden, &golden); err != nil {
		panic(fmt.Sprintf("outboxtest: testdata/cloudevents-js.json: %v", err))
	}
	out := make([]ForeignMessage, 0, len(golden.Messages))
	for _, m := range golden.Messages {
		out = append(out, ForeignMessage{Name: m.Name, About: m.About, Headers: m.Headers, Body: []byte(m.Body)})
	}
	return out
}

// foreignOrder is the payload of the SDK's shop.order.created events.
type foreignOrder struct {
	Order int    `json:"order"`
	Note  string `json:"note"`
}

// EventType implements outbox.Payload.
func (foreignOrder) EventType() string { return "shop.order.created" }

// derivedID is the documented event ID of a CloudEvent whose id is not a UUID, spelled out
// here rather than through cloudevents.EventID so the test pins the formula.
func derivedID(source, id string) uuid.UUID {
	return uuid.NewSHA1(cloudevents.IDNamespace, []byte(source+"\x00"+id))
}

// foreignWants maps each golden message to the message a consumer must get from it.
var foreignWants = func() map[string]outbox.Message {
	at := time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC)
	id := func(n int) uuid.UUID { return uuid.MustParse(fmt.Sprintf("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a%02d", n)) }
	const jsonUTF8 = "application/json; charset=utf-8"
	order := func(id uuid.UUID, ct string, extra map[string]string) outbox.Message {
		h := map[string]string{
			cloudevents.SubjectHeader:    "order-42",
			cloudevents.DataSchemaHeader: "https://shop.example/schemas/order-created.json",
		}
		maps.Copy(h, extra)
		return outbox.Message{ID: id, Type: "shop.order.created", Key: "order-42", Headers: h, ContentType: ct,
			Body: []byte(`{"order":42,"note":"crème brûlée"}`), CreatedAt: at}
	}
	stringID := func(source, ct string) outbox.Message {
		return order(derivedID(source, "order-42-created"), ct, map[string]string{cloudevents.IDHeader: "order-42-created", cloudevents.SourceHeader: source})
	}
	typed := map[string]string{"retrycount": "3", "urgent": "true"}
	bare := order(id(6), jsonUTF8, map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  "congo=t61rcWkgMzE",
	})
	bare.Key = "order-7"
	text := func(n int) outbox.Message {
		return outbox.Message{ID: id(n), Type: "shop.note.added", ContentType: "text/plain", Body: []byte("hello, world"), CreatedAt: at}
	}
	return map[string]outbox.Message{
		"http-binary":                            order(id(1), jsonUTF8, nil),
		"http-structured":                        order(id(2), "", nil),
		"http-binary-string-id":                  stringID("/shop/orders", jsonUTF8),
		"http-structured-string-id":              stringID("/shop/orders", ""),
		"http-binary-string-id-other-source":     stringID("/shop/returns", jsonUTF8),
		"http-structured-string-id-other-source": stringID("/shop/returns", ""),
		"http-binary-typed-extensions":           order(id(3), "application/vnd.shop.order+json", typed),
		"http-structured-typed-extensions":       order(id(4), "application/vnd.shop.order+json", typed),
		"kafka-binary":                           order(id(5), "", nil),
		"http-binary-bare-extensions":            bare,
		"http-binary-lowercase-time":             order(id(7), jsonUTF8, nil),
		"http-structured-lowercase-time":         order(id(8), "", nil),
		"http-binary-header-case":                order(id(9), jsonUTF8, nil),
		"http-binary-text":                       text(10),
		"http-structured-text":                   text(11),
		"http-structured-base64": {ID: id(12), Type: "shop.blob.stored", ContentType: "application/octet-stream",
			Body: []byte{0, 1, 2, 254, 255}, CreatedAt: at},
	}
}()

// checkForeign reports how m, decoded from the foreign message named name, differs from
// what a consumer must get (nil if it does not): every field, exactly these headers, and for
// an order the payload outbox.Decode returns.
func checkForeign(name string, m outbox.Message) error {
	want, ok := foreignWants[name]
	if !ok {
		return fmt.Errorf("no expectation for foreign message %q", name)
	}
	errs := []error{SameMessage(m, want)}
	if !maps.Equal(m.Headers, want.Headers) {
		errs = append(errs, fmt.Errorf("headers %v, want exactly %v", sortedMap(m.Headers), sortedMap(want.Headers)))
	}
	if want.Type == (foreignOrder{}).EventType() {
		e, err := outbox.Decode[foreignOrder](m)
		if err != nil {
			errs = append(errs, fmt.Errorf("outbox.Decode: %w", err))
		} else if e.Payload != (foreignOrder{Order: 42, Note: "crème brûlée"}) {
			errs = append(errs, fmt.Errorf("payload %+v", e.Payload))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("foreign message %s: %w", name, err)
	}
	return nil
}

func sortedMap(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q ", k, m[k])
	}
	return "{" + strings.TrimSpace(b.String()) + "}"
}
