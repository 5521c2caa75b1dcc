package outboxsqs

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
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

// TestEncodeFoldsSubject: subject and dataschema folded into txheaders for lack of room
// come back as the headers they were, not as extensions.
func TestEncodeFoldsSubject(t *testing.T) {
	t.Parallel()
	m := testMessage()
	m.Headers = map[string]string{
		cloudevents.IDHeader: "order-42-created", cloudevents.SourceHeader: "/shop/orders",
		cloudevents.SubjectHeader: "order-42", cloudevents.DataSchemaHeader: "https://x/s.json",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=b", "aaa": "1",
	}
	m.ID = cloudevents.EventID("/shop/orders", "order-42-created")
	w := roundTrip(t, m)
	if len(w.attrs) != maxAttributes || *w.attrs["ce-id"].StringValue != "order-42-created" || w.attrs["ce-dataschema"].StringValue != nil {
		t.Fatalf("attributes %v: want all 10 used, the original id, dataschema folded", w.attrNames())
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

// TestDecodeMalformed: a message that is not an event is an *outbox.MalformedError keeping
// the MessageId, every attribute (whatever its data type) and the body as SQS delivered
// them, and what the attributes say.
func TestDecodeMalformed(t *testing.T) {
	t.Parallel()
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: ptr("String"), StringValue: ptr(v)}
	}
	ce := map[string]types.MessageAttributeValue{
		"ce-specversion": str("1.0"), "ce-id": str("order-1"), "ce-source": str("/shop"), "ce-type": str("shop.order.created"),
		"ce-partitionkey": str("k1"), "blob": {DataType: ptr("Binary"), BinaryValue: []byte{0, 0xff}},
		"ce-count": {DataType: ptr("Number"), StringValue: ptr("3")},
	}
	with := func(extra map[string]types.MessageAttributeValue) map[string]types.MessageAttributeValue {
		out := maps.Clone(ce)
		maps.Copy(out, extra)
		return out
	}
	for name, tc := range map[string]struct {
		msg         types.Message
		partialType string
	}{
		"plain text": {msg: types.Message{Body: ptr("hello")}},
		"no type":    {msg: types.Message{Body: ptr("{}"), MessageAttributes: with(map[string]types.MessageAttributeValue{"ce-type": str("")})}},
		"old spec": {msg: types.Message{Body: ptr("{}"), MessageAttributes: with(map[string]types.MessageAttributeValue{"ce-specversion": str("0.3")})},
			partialType: "shop.order.created"},
		"bad base64": {msg: types.Message{Body: ptr("!!"), MessageAttributes: with(map[string]types.MessageAttributeValue{bodyAttr: str(bodyBase64)})},
			partialType: "shop.order.created"},
		"unknown body marker": {msg: types.Message{Body: ptr("x"), MessageAttributes: with(map[string]types.MessageAttributeValue{bodyAttr: str("gzip")})},
			partialType: "shop.order.created"},
	} {
		name, tc := name, tc
		tc.msg.MessageId = ptr("sqs-" + name)
		_, err := decode(tc.msg)
		var me *outbox.MalformedError
		if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
			t.Errorf("%s: decode error %v, want *outbox.MalformedError", name, err)
			continue
		}
		if me.BrokerMessageID != "sqs-"+name || string(me.Body) != *tc.msg.Body || len(me.Attributes) != len(tc.msg.MessageAttributes) {
			t.Errorf("%s: evidence id %q body %q attributes %v", name, me.BrokerMessageID, me.Body, me.Attributes)
		}
		for k, v := range tc.msg.MessageAttributes {
			want := deref(v.StringValue)
			if v.BinaryValue != nil {
				want = string(v.BinaryValue)
			}
			if got, ok := me.Attributes[k]; !ok || got != want {
				t.Errorf("%s: attribute %s = %q, want %q", name, k, got, want)
			}
		}
		if me.Partial.Type != tc.partialType || tc.partialType != "" && (me.Partial.Key != "k1" || me.Partial.Headers["count"] != "3") {
			t.Errorf("%s: partial %+v", name, me.Partial)
		}
	}
}

// TestEncodeEscapesJSON: a JSON payload with characters SQS refuses stays JSON, readable by
// any consumer, with the characters escaped; only a payload that is not JSON is base64.
func TestEncodeEscapesJSON(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"application/json", "application/vnd.shop.order+json; charset=utf-8"} {
		m := testMessage()
		m.ContentType = ct
		m.Body = []byte("{\"s\":\"a\uffffb\ufffe\",\n \"é\":[1,2]}")
		w, err := encode(m, "/test")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := w.attrs[bodyAttr]; ok || !validText(w.body) || !json.Valid([]byte(w.body)) {
			t.Fatalf("%s: body %q with attributes %v, want escaped JSON", ct, w.body, w.attrNames())
		}
		if want := `{"s":"a\uffffb\ufffe",` + "\n" + ` "é":[1,2]}`; w.body != want {
			t.Fatalf("%s: body %q, want %q", ct, w.body, want)
		}
		got, err := decode(w.received())
		if err != nil || !sameJSON(got.Body, m.Body) {
			t.Fatalf("%s: read back %q, %v", ct, got.Body, err)
		}
	}
	// Not JSON (or not UTF-8) under a JSON label: base64, marked, bytes kept.
	for _, body := range []string{"\ufffe not json", "{\"s\":\"\xff\ufffe\"}"} {
		m := testMessage()
		m.Body = []byte(body)
		w := roundTrip(t, m)
		if w.attrs[bodyAttr].StringValue == nil || *w.attrs[bodyAttr].StringValue != bodyBase64 {
			t.Fatalf("%q: attributes %v, want the base64 marker", body, w.attrNames())
		}
	}
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var va, vb any
	return json.Unmarshal(a, &va) == nil && json.Unmarshal(b, &vb) == nil && reflect.DeepEqual(va, vb)
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
		// A JSON body SQS cannot carry as is arrives escaped: the same JSON value.
		escaped := !validText(string(m.Body)) && w.attrs[bodyAttr].StringValue == nil && sameJSON(got.Body, m.Body)
		if got.ID != m.ID || got.Key != m.Key || !bytes.Equal(got.Body, m.Body) && !escaped {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
		for k, v := range m.Headers {
			if got.Headers[k] != v {
				t.Fatalf("header %q = %q, want %q", k, got.Headers[k], v)
			}
		}
	})
}

// attributeLines spells SQS attributes for the fuzz input: each value is "type\tvalue".
func attributeLines(attrs map[string]types.MessageAttributeValue) string {
	h := map[string]string{}
	for k, v := range attrs {
		val := deref(v.StringValue)
		if v.BinaryValue != nil {
			val = string(v.BinaryValue)
		}
		h[k] = deref(v.DataType) + "\t" + val
	}
	return outboxtest.HeaderLines(h)
}

// parseAttributes reads fuzz input lines into SQS message attributes.
func parseAttributes(lines string) map[string]types.MessageAttributeValue {
	attrs := map[string]types.MessageAttributeValue{}
	for _, h := range outboxtest.ParseHeaderLines(lines) {
		dt, v, ok := strings.Cut(h[1], "\t")
		switch {
		case !ok:
		case strings.HasPrefix(dt, "Binary"):
			attrs[h[0]] = types.MessageAttributeValue{DataType: ptr(dt), BinaryValue: []byte(v)}
		default:
			attrs[h[0]] = types.MessageAttributeValue{DataType: ptr(dt), StringValue: ptr(v)}
		}
	}
	return attrs
}

// FuzzDecode: any attributes and body decode to an event or to an *outbox.MalformedError
// that keeps every attribute and the body byte for byte and the MessageId, never a panic;
// a decoded event written by our encoder reads back as the same event. Seeds: our own
// messages and those of the CloudEvents JavaScript SDK (outboxtest/testdata).
func FuzzDecode(f *testing.F) {
	for _, m := range []outbox.Message{testMessage(), {ID: uuid.Must(uuid.NewV7()), Type: "t", ContentType: "application/octet-stream", Body: []byte{0, 0xff}}} {
		m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
		w, err := encode(m, "/test")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(attributeLines(w.attrs), w.body)
	}
	for _, fm := range outboxtest.ForeignMessages() {
		attrs := map[string]types.MessageAttributeValue{}
		for k, v := range fm.Headers {
			attrs[k] = types.MessageAttributeValue{DataType: ptr(stringType), StringValue: ptr(v)}
		}
		f.Add(attributeLines(attrs), string(fm.Body))
	}
	f.Add("", "not a CloudEvent")
	f.Add("ce-id\tNumber\t42\nce_type\tString\tt\nce-specversion\tString.x\t1.0\nblob\tBinary\t\xff", "{}")
	f.Add(bodyAttr+"\tString\t"+bodyBase64+"\n", "!!")
	f.Fuzz(func(t *testing.T, lines, body string) {
		attrs := parseAttributes(lines)
		got, err := decode(types.Message{MessageId: ptr("m-1"), Body: &body, MessageAttributes: attrs})
		if err != nil {
			raw := map[string]string{} // String and Number values as text, Binary ones as bytes
			for k, v := range attrs {
				raw[k] = deref(v.StringValue)
				if v.BinaryValue != nil {
					raw[k] = string(v.BinaryValue)
				}
			}
			if err := outboxtest.CheckMalformed(err, raw, []byte(body), "m-1"); err != nil {
				t.Fatal(err)
			}
			return
		}
		if got.ID == uuid.Nil || got.Type == "" {
			t.Fatalf("decoded an event without ID or type: %+v", got)
		}
		w, err := encode(got, "/fuzz")
		if err != nil {
			return // what SQS cannot carry is refused, never mangled
		}
		back, err := decode(w.received())
		if err != nil || back.ID != got.ID || back.Type != got.Type || back.Key != got.Key || !maps.Equal(back.Headers, got.Headers) {
			t.Fatalf("written again: read back %+v, %v; want %+v", back, err, got)
		}
	})
}
