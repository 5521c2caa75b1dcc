package outboxsqs

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
)

func testMessage() outbox.Message {
	return outbox.Message{
		ID:          uuid.Must(uuid.NewV7()),
		Type:        "orders.completed",
		Key:         "order-42",
		ContentType: "application/json",
		Body:        []byte(`{"id":42}`),
		CreatedAt:   time.Now().UTC().Truncate(time.Microsecond),
	}
}

// attrNames lists the attribute names of w, sorted.
func (w wireMessage) attrNames() []string { return slices.Sorted(maps.Keys(w.attrs)) }

// received is what ReceiveMessage returns for a message sent as w.
func (w wireMessage) received() types.Message {
	return types.Message{Body: &w.body, MessageAttributes: w.attrs}
}

func roundTrip(t *testing.T, m outbox.Message) wireMessage {
	t.Helper()
	w, err := encode(m, "/test")
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	if len(w.attrs) > maxAttributes {
		t.Fatalf("%d attributes (%v), SQS allows %d", len(w.attrs), w.attrNames(), maxAttributes)
	}
	got, err := decode(w.received())
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if err := outboxtest.SameMessage(got, m); err != nil {
		t.Fatal(err)
	}
	if len(got.Headers) != len(m.Headers) {
		t.Fatalf("headers %v, want %v", got.Headers, m.Headers)
	}
	return w
}

func TestEncodeKeepsCloudEventsAttributes(t *testing.T) {
	m := testMessage()
	m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
	w := roundTrip(t, m)
	want := []string{"ce-id", "ce-partitionkey", "ce-source", "ce-specversion", "ce-time", "ce-traceparent", "ce-txheaders", "ce-type", "content-type"}
	if got := w.attrNames(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("attributes %v, want %v", got, want)
	}
	if w.body != `{"id":42}` {
		t.Fatalf("body %q, want the payload as is", w.body)
	}
}

// Headers beyond SQS's 10 attributes, empty ones and ones SQS cannot carry travel in
// ce-txheaders; trace context keeps its own attributes first.
func TestEncodeFoldsHeadersIntoTenAttributes(t *testing.T) {
	m := testMessage()
	m.Headers = map[string]string{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  "congo=t61rcWkgMzE",
		"aaa":         "1", "bbb": "2", "ccc": "3", "ddd": "4", "eee": "5",
		"empty":    "",
		"control":  "a\x01b",
		"X-Tenant": "acme",
	}
	m.Body = []byte{0xff, 0x00, 0x01} // not text: base64 plus a marker attribute
	m.ContentType = "application/octet-stream"
	w := roundTrip(t, m)
	if len(w.attrs) != maxAttributes {
		t.Fatalf("%d attributes %v, want all %d used", len(w.attrs), w.attrNames(), maxAttributes)
	}
	// 7 CloudEvents attributes, txheaders and the body marker leave room for one extension:
	// traceparent.
	for _, name := range []string{"ce-traceparent", bodyAttr, txHeadersAttr} {
		if _, ok := w.attrs[name]; !ok {
			t.Errorf("attribute %s missing from %v", name, w.attrNames())
		}
	}
	for _, name := range []string{"ce-empty", "ce-control"} {
		if _, ok := w.attrs[name]; ok {
			t.Errorf("attribute %s should have been folded into %s", name, txHeadersAttr)
		}
	}
}

func TestEncodeBodies(t *testing.T) {
	for name, body := range map[string][]byte{
		"json":         []byte(`{"a":"é€😀"}`),
		"empty":        nil,
		"binary":       {0, 1, 2, 0xfe, 0xff},
		"bad utf-8":    []byte("a\xc3"),
		"surrogate":    []byte("\xed\xa0\x80"),
		"noncharacter": []byte("\xef\xbf\xbe"),
		"whitespace":   []byte("\t\r\n "),
	} {
		t.Run(name, func(t *testing.T) {
			m := testMessage()
			m.Body = body
			w := roundTrip(t, m)
			if !validText(w.body) || w.body == "" {
				t.Fatalf("body %q is not something SQS accepts", w.body)
			}
		})
	}
}

func TestEncodeRejectsWhatSQSCannotCarry(t *testing.T) {
	m := testMessage()
	m.Key = "bad\x00key"
	if _, err := encode(m, "/test"); err == nil || !strings.Contains(err.Error(), "ce-partitionkey") {
		t.Fatalf("encode = %v, want an error naming ce-partitionkey", err)
	}
	m = testMessage()
	m.Type = ""
	if _, err := encode(m, "/test"); err == nil {
		t.Fatal("encode of a message without a type succeeded")
	}
	m = testMessage()
	m.ID = uuid.Nil
	if _, err := encode(m, "/test"); err == nil {
		t.Fatal("encode of a message without an ID succeeded")
	}
	m = testMessage()
	m.Headers = map[string]string{"x": "\xff"}
	if _, err := encode(m, "/test"); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("encode of a header that is not UTF-8 = %v, want an error", err)
	}
}

func TestEncodeSizeCountsAttributes(t *testing.T) {
	m := testMessage()
	w, err := encode(m, "/test")
	if err != nil {
		t.Fatal(err)
	}
	want := len(w.body)
	for name, v := range w.attrs {
		want += len(name) + len(*v.DataType) + len(*v.StringValue)
	}
	if w.size != want || w.size <= len(m.Body) {
		t.Fatalf("size %d, want %d (body %d)", w.size, want, len(m.Body))
	}
}

func TestDecodeMalformed(t *testing.T) {
	for name, msg := range map[string]types.Message{
		"plain text": {Body: ptr("hello")},
		"bad base64": {Body: ptr("!!"), MessageAttributes: map[string]types.MessageAttributeValue{
			bodyAttr: {DataType: ptr("String"), StringValue: ptr(bodyBase64)}}},
		"unknown body marker": {Body: ptr("x"), MessageAttributes: map[string]types.MessageAttributeValue{
			bodyAttr: {DataType: ptr("String"), StringValue: ptr("gzip")}}},
	} {
		if _, err := decode(msg); !errors.Is(err, outbox.ErrMalformed) {
			t.Errorf("%s: decode error %v, want outbox.ErrMalformed", name, err)
		}
	}
}

func TestGroupID(t *testing.T) {
	if got := groupID("order-42"); got != "order-42" {
		t.Errorf("groupID(order-42) = %q", got)
	}
	for _, key := range []string{"with space", "ключ", strings.Repeat("k", 129)} {
		g := groupID(key)
		if !validGroupID(g) || g == key {
			t.Errorf("groupID(%q) = %q, not a valid group ID of its own", key, g)
		}
		if groupID(key) != g {
			t.Errorf("groupID(%q) is not stable", key)
		}
	}
}

func FuzzEncodeDecode(f *testing.F) {
	f.Add("k", "traceparent", "00-abc-01", "X-H", "v", []byte(`{"n":1}`))
	f.Add("", "", "", "", "", []byte{})
	f.Add("key with space", "a1", "", "b", "\x01", []byte{0xff, 0xfe})
	f.Fuzz(func(t *testing.T, key, h1, v1, h2, v2 string, body []byte) {
		m := testMessage()
		m.Key, m.Body = key, body
		m.Headers = map[string]string{}
		if h1 != "" {
			m.Headers[h1] = v1
		}
		if h2 != "" {
			m.Headers[h2] = v2
		}
		w, err := encode(m, "/fuzz")
		if err != nil {
			return // a message SQS cannot carry is refused, never mangled
		}
		if len(w.attrs) > maxAttributes || !validText(w.body) || w.body == "" {
			t.Fatalf("encoded %d attributes, body %q: SQS would reject it", len(w.attrs), w.body)
		}
		for name, v := range w.attrs {
			if *v.StringValue == "" || !validText(*v.StringValue) {
				t.Fatalf("attribute %s = %q: SQS would reject it", name, *v.StringValue)
			}
		}
		got, err := decode(w.received())
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if got.ID != m.ID || got.Key != m.Key || !bytes.Equal(got.Body, m.Body) {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
		for k, v := range m.Headers {
			if got.Headers[k] != v {
				t.Fatalf("header %q = %q, want %q", k, got.Headers[k], v)
			}
		}
	})
}
