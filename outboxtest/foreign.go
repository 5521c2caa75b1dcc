package outboxtest

import (
	"bytes"
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
	outboxce "github.com/txoutbox/outbox/cloudevents"
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
	for _, v := range m.Headers {
		return strings.HasPrefix(strings.ToLower(v), outboxce.StructuredContentType)
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

// foreignWant is what a consumer must get from one foreign message.
type foreignWant struct {
	id          uuid.UUID
	typ, key    string
	contentType string
	headers     map[string]string // exactly these
	created     time.Time
	body        []byte        // when set, byte for byte
	order       *foreignOrder // when set, what outbox.Decode must return
}

// derivedID is the documented event ID of a CloudEvent whose id is not a UUID, spelled out
// here rather than through outboxce.EventID so the test pins the formula.
func derivedID(source, id string) uuid.UUID {
	return uuid.NewSHA1(outboxce.IDNamespace, []byte(source+"\x00"+id))
}

// foreignWants maps each golden message to what the consumer must get from it.
var foreignWants = func() map[string]foreignWant {
	at := time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC)
	order := &foreignOrder{Order: 42, Note: "crème brûlée"}
	id := func(n int) uuid.UUID { return uuid.MustParse(fmt.Sprintf("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a%02d", n)) }
	described := func(extra map[string]string) map[string]string {
		h := map[string]string{
			outboxce.SubjectHeader:    "order-42",
			outboxce.DataSchemaHeader: "https://shop.example/schemas/order-created.json",
		}
		maps.Copy(h, extra)
		return h
	}
	const jsonUTF8 = "application/json; charset=utf-8"
	base := func(n int, ct string) foreignWant {
		return foreignWant{id: id(n), typ: "shop.order.created", key: "order-42", contentType: ct, headers: described(nil), created: at, order: order}
	}
	stringID := func(source, ct string) foreignWant {
		w := base(0, ct)
		w.id = derivedID(source, "order-42-created")
		w.headers = described(map[string]string{outboxce.IDHeader: "order-42-created", outboxce.SourceHeader: source})
		return w
	}
	typed := func(n int, ct string) foreignWant {
		w := base(n, ct)
		w.headers = described(map[string]string{"retrycount": "3", "urgent": "true"})
		return w
	}
	bare := base(6, jsonUTF8)
	bare.key = "order-7"
	bare.headers = described(map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  "congo=t61rcWkgMzE",
	})
	text := func(n int) foreignWant {
		return foreignWant{id: id(n), typ: "shop.note.added", contentType: "text/plain", created: at, body: []byte("hello, world")}
	}
	structured := base(2, "")
	structured.body = []byte(`{"order":42,"note":"crème brûlée"}`) // as the SDK embedded it
	return map[string]foreignWant{
		"http-binary":                            base(1, jsonUTF8),
		"http-structured":                        structured,
		"http-binary-string-id":                  stringID("/shop/orders", jsonUTF8),
		"http-structured-string-id":              stringID("/shop/orders", ""),
		"http-binary-string-id-other-source":     stringID("/shop/returns", jsonUTF8),
		"http-structured-string-id-other-source": stringID("/shop/returns", ""),
		"http-binary-typed-extensions":           typed(3, "application/vnd.shop.order+json"),
		"http-structured-typed-extensions":       typed(4, "application/vnd.shop.order+json"),
		"kafka-binary":                           base(5, ""),
		"http-binary-bare-extensions":            bare,
		"http-binary-lowercase-time":             base(7, jsonUTF8),
		"http-structured-lowercase-time":         base(8, ""),
		"http-binary-header-case":                base(9, jsonUTF8),
		"http-binary-text":                       text(10),
		"http-structured-text":                   text(11),
		"http-structured-base64": {id: id(12), typ: "shop.blob.stored", contentType: "application/octet-stream",
			created: at, body: []byte{0, 1, 2, 254, 255}},
	}
}()

// checkForeign reports how m, decoded from the foreign message named name, differs from
// what a consumer must get (nil if it does not).
func checkForeign(name string, m outbox.Message) error {
	w, ok := foreignWants[name]
	if !ok {
		return fmt.Errorf("no expectation for foreign message %q", name)
	}
	var errs []error
	if m.ID != w.id {
		errs = append(errs, fmt.Errorf("ID %s, want %s", m.ID, w.id))
	}
	if m.Type != w.typ || m.Key != w.key || m.ContentType != w.contentType {
		errs = append(errs, fmt.Errorf("type/key/content-type %q/%q/%q, want %q/%q/%q", m.Type, m.Key, m.ContentType, w.typ, w.key, w.contentType))
	}
	if !maps.Equal(m.Headers, w.headers) {
		errs = append(errs, fmt.Errorf("headers %v, want %v", sortedMap(m.Headers), sortedMap(w.headers)))
	}
	if !m.CreatedAt.Equal(w.created) {
		errs = append(errs, fmt.Errorf("CreatedAt %v, want %v", m.CreatedAt, w.created))
	}
	if w.body != nil && !bytes.Equal(m.Body, w.body) {
		errs = append(errs, fmt.Errorf("body %q, want %q", m.Body, w.body))
	}
	if w.order != nil {
		e, err := outbox.Decode[foreignOrder](m)
		if err != nil {
			errs = append(errs, fmt.Errorf("outbox.Decode: %w", err))
		} else if e.Payload != *w.order {
			errs = append(errs, fmt.Errorf("payload %+v, want %+v", e.Payload, *w.order))
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
