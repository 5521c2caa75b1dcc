package cloudevents

import (
	"bytes"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
)

// foreign returns binary-mode headers of a foreign event, with extra headers added (an
// empty value deletes one).
func foreign(extra map[string]string) map[string]string {
	h := map[string]string{
		"ce-specversion": "1.0", "ce-id": "order-42-created", "ce-source": "/shop/orders",
		"ce-type": "shop.order.created", "content-type": "application/json",
	}
	for k, v := range extra {
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
	}
	return h
}

// TestEventID pins the derivation of event IDs from foreign ids.
func TestEventID(t *testing.T) {
	t.Parallel()
	if got := uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/txoutbox/outbox/cloudevents#id")); got != IDNamespace {
		t.Fatalf("IDNamespace %s, want %s as documented", IDNamespace, got)
	}
	u := uuid.MustParse("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a01")
	for id, want := range map[string]uuid.UUID{
		u.String():                              u,
		strings.ToUpper(u.String()):             u,
		"order-42-created":                      uuid.NewSHA1(IDNamespace, []byte("/shop/orders\x00order-42-created")),
		"urn:uuid:" + u.String():                uuid.NewSHA1(IDNamespace, []byte("/shop/orders\x00urn:uuid:"+u.String())),
		strings.ReplaceAll(u.String(), "-", ""): uuid.NewSHA1(IDNamespace, []byte("/shop/orders\x00"+strings.ReplaceAll(u.String(), "-", ""))),
		uuid.Nil.String():                       uuid.NewSHA1(IDNamespace, []byte("/shop/orders\x00"+uuid.Nil.String())),
	} {
		if got := EventID("/shop/orders", id); got != want {
			t.Errorf("EventID(/shop/orders, %q) = %s, want %s", id, got, want)
		}
	}
	if EventID("/shop/orders", "1") == EventID("/shop/returns", "1") {
		t.Error("the same id from two sources gives one event ID")
	}
	// NUL separates source and id: a source with NUL would make two pairs one name.
	if _, err := FromBinary(foreign(map[string]string{"ce-source": "/a\x00b", "ce-id": "c"}), nil); !errors.Is(err, outbox.ErrMalformed) {
		t.Errorf("a source with NUL and a derived ID: %v, want ErrMalformed", err)
	}
}

// TestForeignIDs: an id that is not a UUID gets a stable derived event ID, keeps the
// original id and source in headers, and goes back out as the same CloudEvent.
func TestForeignIDs(t *testing.T) {
	t.Parallel()
	m, err := FromBinary(foreign(nil), []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	want := EventID("/shop/orders", "order-42-created")
	if m.ID != want || m.Headers[IDHeader] != "order-42-created" || m.Headers[SourceHeader] != "/shop/orders" {
		t.Fatalf("decoded %s %v, want ID %s with the original id and source", m.ID, m.Headers, want)
	}
	h, err := ToBinary(m, "/our-relay")
	if err != nil {
		t.Fatal(err)
	}
	if h["ce-id"] != "order-42-created" || h["ce-source"] != "/shop/orders" || h["ce-txheaders"] != "" {
		t.Fatalf("re-encoded as %v, want the original id and source as attributes", h)
	}
	doc, _ := ToStructured(m, "/our-relay")
	if again, err := FromStructured(doc); err != nil || again.ID != m.ID || !maps.Equal(again.Headers, m.Headers) {
		t.Fatalf("structured round trip: %+v, %v", again, err)
	}

	// An upper-case UUID is the event ID as is, and goes back out unchanged.
	u := uuid.Must(uuid.NewV7())
	m, err = FromBinary(foreign(map[string]string{"ce-id": strings.ToUpper(u.String())}), nil)
	if err != nil || m.ID != u || m.Headers[IDHeader] != strings.ToUpper(u.String()) || m.Headers[SourceHeader] != "" {
		t.Fatalf("upper-case UUID: %+v, %v", m, err)
	}
	if h, _ := ToBinary(m, ""); h["ce-id"] != strings.ToUpper(u.String()) || h["ce-source"] != DefaultSource {
		t.Fatalf("upper-case UUID re-encoded as %v", h)
	}
	// Our own ids carry no extra headers.
	m, err = FromBinary(foreign(map[string]string{"ce-id": u.String()}), nil)
	if err != nil || m.ID != u || len(m.Headers) != 0 {
		t.Fatalf("lower-case UUID: %+v, %v", m, err)
	}

	// An original id that no longer names the event (the ID was changed) is not written
	// as the id: the event keeps its ID, the header travels as a header.
	m = sample()
	m.Headers = map[string]string{IDHeader: "order-42-created", SourceHeader: "/shop/orders"}
	h, _ = ToBinary(m, "")
	if h["ce-id"] != m.ID.String() || h["ce-source"] != "/shop/orders" || !strings.Contains(h["ce-txheaders"], IDHeader) {
		t.Fatalf("mismatched original id written as %v", h)
	}
	if again, err := FromBinary(h, m.Body); err != nil || again.ID != m.ID || again.Headers[IDHeader] != "order-42-created" {
		t.Fatalf("mismatched original id read back: %+v, %v", again, err)
	}
}

// TestBinaryHeaderStyles: "ce-" in any case, the "ce_" style, bare partitionkey,
// traceparent and tracestate; the exact "ce-" style wins a clash, whatever the map order.
func TestBinaryHeaderStyles(t *testing.T) {
	t.Parallel()
	u := uuid.Must(uuid.NewV7()).String()
	for name, tc := range map[string]struct {
		headers map[string]string
		key     string
		hdr     map[string]string
	}{
		"underscore": {headers: map[string]string{"ce_specversion": "1.0", "ce_id": u, "ce_type": "t", "ce_source": "/s",
			"ce_partitionkey": "k", "ce_traceparent": "tp", "content-type": "application/json"}, key: "k", hdr: map[string]string{"traceparent": "tp"}},
		"canonical case": {headers: map[string]string{"Ce-Specversion": "1.0", "Ce-Id": u, "Ce-Type": "t", "CE-SOURCE": "/s",
			"Ce-Partitionkey": "k", "Ce-Retrycount": "3", "Content-Type": "application/json"}, key: "k", hdr: map[string]string{"retrycount": "3"}},
		"bare extensions": {headers: map[string]string{"ce-specversion": "1.0", "ce-id": u, "ce-type": "t",
			"partitionkey": "k", "Traceparent": "tp", "tracestate": "ts", "x-other": "ignored"}, key: "k", hdr: map[string]string{"traceparent": "tp", "tracestate": "ts"}},
		"exact style wins": {headers: map[string]string{"ce-specversion": "1.0", "ce-id": u, "CE-ID": "other", "ce_id": "other2",
			"ce-type": "t", "Ce-Type": "t2", "ce-partitionkey": "k", "partitionkey": "bare", "ce_partitionkey": "u"}, key: "k"},
		"other case beats underscore": {headers: map[string]string{"ce-specversion": "1.0", "Ce-Id": u, "ce_id": "other",
			"ce-type": "t", "Ce-Partitionkey": "k", "ce_partitionkey": "u", "partitionkey": "bare"}, key: "k"},
	} {
		for range 20 { // map order varies from run to run
			m, err := FromBinary(tc.headers, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if m.ID.String() != u || m.Type != "t" || m.Key != tc.key || !maps.Equal(m.Headers, tc.hdr) {
				t.Fatalf("%s: got ID %s type %q key %q headers %v", name, m.ID, m.Type, m.Key, m.Headers)
			}
		}
	}
}

// TestStructuredExtensionTypes: extension values of any CloudEvents type are kept as text.
func TestStructuredExtensionTypes(t *testing.T) {
	t.Parallel()
	doc := `{"specversion":"1.0","id":"e1","source":"/s","type":"t","retrycount":3,"urgent":true,"ratio":1.5e3,
		"gone":null,"tags":["a", "b"],"obj":{"x": 1},"name":"n","data":{"a":1}}`
	m, err := FromStructured([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"retrycount": "3", "urgent": "true", "ratio": "1.5e3", "tags": `["a","b"]`, "obj": `{"x":1}`, "name": "n",
		IDHeader: "e1", SourceHeader: "/s"}
	if !maps.Equal(m.Headers, want) || string(m.Body) != `{"a":1}` {
		t.Fatalf("headers %v body %s, want %v", m.Headers, m.Body, want)
	}
}

func TestTimeAnyCase(t *testing.T) {
	t.Parallel()
	want := time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC)
	for _, v := range []string{"2026-11-22T10:00:00.123Z", "2026-11-22t10:00:00.123z", "2026-11-22t11:00:00.123+01:00"} {
		m, err := FromBinary(foreign(map[string]string{"ce-time": v}), nil)
		if err != nil || !m.CreatedAt.Equal(want) {
			t.Errorf("time %q: %v, %v", v, m.CreatedAt, err)
		}
	}
	// No time: none is written back (not year 1).
	m, _ := FromBinary(foreign(nil), nil)
	if h, _ := ToBinary(m, ""); h["ce-time"] != "" || !m.CreatedAt.IsZero() {
		t.Fatalf("an event without time: CreatedAt %v, written %q", m.CreatedAt, h["ce-time"])
	}
}

// TestSubjectAndDataSchema reach the handler as headers and go back out as the attributes.
func TestSubjectAndDataSchema(t *testing.T) {
	t.Parallel()
	m, err := FromBinary(foreign(map[string]string{"ce-subject": "order-42", "ce-dataschema": "https://x/s.json"}), nil)
	if err != nil || m.Headers[SubjectHeader] != "order-42" || m.Headers[DataSchemaHeader] != "https://x/s.json" {
		t.Fatalf("%+v, %v", m, err)
	}
	h, _ := ToBinary(m, "")
	if h["ce-subject"] != "order-42" || h["ce-dataschema"] != "https://x/s.json" || h["ce-txheaders"] != "" {
		t.Fatalf("written as %v", h)
	}
	a, _ := attributes(m, "")
	if a["subject"] != "order-42" || a["dataschema"] != "https://x/s.json" {
		t.Fatalf("structured attributes %v", a)
	}
	// An empty one is not a legal attribute: it travels as a header.
	m.Headers[SubjectHeader] = ""
	h, _ = ToBinary(m, "")
	if _, ok := h["ce-subject"]; ok || !strings.Contains(h["ce-txheaders"], SubjectHeader) {
		t.Fatalf("empty subject written as %v", h)
	}
}

// TestStructuredOverBinary: a structured-mode message in a binding with headers.
func TestStructuredOverBinary(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"specversion":"1.0","id":"e1","source":"/s","type":"t","data":{"a":1}}`)
	for name, headers := range map[string]map[string]string{
		"content type":      {"content-type": "application/cloudevents+json; charset=utf-8", "traceparent": "tp", "partitionkey": "k"},
		"canonical":         {"Content-Type": "Application/CloudEvents+JSON", "Traceparent": "tp", "Partitionkey": "k"},
		"no headers at all": {"traceparent": "tp", "partitionkey": "k"},
		"unrelated headers": {"Nats-Msg-Id": "x", "traceparent": "tp", "partitionkey": "k"},
	} {
		m, err := FromBinary(headers, doc)
		if err != nil || m.ID != EventID("/s", "e1") || string(m.Body) != `{"a":1}` || m.Key != "k" || m.Headers["traceparent"] != "tp" {
			t.Errorf("%s: %+v, %v", name, m, err)
		}
	}
	_, err := FromBinary(map[string]string{"content-type": "application/cloudevents-batch+json"}, []byte("["+string(doc)+"]"))
	var me *outbox.MalformedError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "batch") {
		t.Fatalf("batch: %v", err)
	}
}

func TestStructuredTextData(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]string{
		`{"specversion":"1.0","id":"1","source":"/s","type":"t","datacontenttype":"text/plain","data":"hello"}`:       "hello",
		`{"specversion":"1.0","id":"1","source":"/s","type":"t","datacontenttype":"application/json","data":"hello"}`: `"hello"`,
		`{"specversion":"1.0","id":"1","source":"/s","type":"t","data":"hello"}`:                                      `"hello"`,
		`{"specversion":"1.0","id":"1","source":"/s","type":"t","datacontenttype":"text/xml","data":"<a/>"}`:          "<a/>",
		`{"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"AAE"}`:                                 "\x00\x01",
	} {
		m, err := FromStructured([]byte(doc))
		if err != nil || string(m.Body) != want {
			t.Errorf("%s: body %q, %v; want %q", doc, m.Body, err, want)
		}
	}
}

// TestMalformedKeepsWhatWasRead: the error of a message that is not a valid event is a
// *outbox.MalformedError with the attributes that could be read and the input.
func TestMalformedKeepsWhatWasRead(t *testing.T) {
	t.Parallel()
	headers := foreign(map[string]string{"ce-specversion": "0.3", "ce-partitionkey": "k", "ce-traceparent": "tp", "x-other": "o"})
	body := []byte(`{"order":1}`)
	_, err := FromBinary(headers, body)
	var me *outbox.MalformedError
	if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
		t.Fatalf("FromBinary error %v (%T), want *outbox.MalformedError", err, err)
	}
	p := me.Partial
	if p.ID != EventID("/shop/orders", "order-42-created") || p.Type != "shop.order.created" || p.Key != "k" ||
		p.Headers["traceparent"] != "tp" || p.ContentType != "application/json" || !bytes.Equal(p.Body, body) {
		t.Errorf("partial %+v", p)
	}
	if !maps.Equal(me.Attributes, headers) || !bytes.Equal(me.Body, body) || !strings.Contains(me.Err.Error(), `specversion "0.3"`) {
		t.Errorf("evidence: attributes %v body %q err %v", me.Attributes, me.Body, me.Err)
	}
	headers["x-other"] = "changed later" // the error holds its own copy
	if me.Attributes["x-other"] != "o" {
		t.Error("MalformedError.Attributes aliases the caller's map")
	}

	doc := []byte(`{"specversion":"1.0","id":"e1","source":"/s","type":"t","partitionkey":"k","data_base64":"***"}`)
	_, err = FromStructured(doc)
	if !errors.As(err, &me) || me.Partial.Type != "t" || me.Partial.Key != "k" || !bytes.Equal(me.Body, doc) || !bytes.Equal(me.Partial.Body, doc) {
		t.Fatalf("structured: %+v", me)
	}

	// Malformed completes it with the broker's view.
	got := Malformed(err, "sqs-123", map[string]string{"a": "b"}, []byte("raw"))
	if got.BrokerMessageID != "sqs-123" || got.Partial.Type != "t" || string(got.Body) != "raw" || got.Attributes["a"] != "b" ||
		!errors.Is(got, outbox.ErrMalformed) || strings.Count(got.Error(), "malformed") != 1 {
		t.Fatalf("Malformed: %+v (%v)", got, got)
	}
	other := errors.New("body is not base64")
	if got := Malformed(other, "1", nil, nil); got.Err != other || !reflect.DeepEqual(got.Partial, outbox.Message{}) {
		t.Fatalf("Malformed of another error: %+v", got)
	}
}

func FuzzFromBinary(f *testing.F) {
	h, _ := ToBinary(sample(), "")
	f.Add(h["ce-id"], h["ce-type"], h["ce-time"], "ce_partitionkey", "k", "Content-Type", "application/json; charset=utf-8", []byte(`{"n":1}`))
	f.Add("order-42", "t", "2026-11-22t10:00:00z", "traceparent", "tp", "content-type", StructuredContentType, []byte(`{"specversion":"1.0","id":"1","type":"t","retrycount":3}`))
	f.Add("", "", "", "", "", "", "", []byte("not a CloudEvent"))
	f.Fuzz(func(t *testing.T, id, typ, tm, k1, v1, k2, v2 string, body []byte) {
		headers := map[string]string{"ce-specversion": "1.0", "ce-id": id, "ce-type": typ, "ce-time": tm, k1: v1, k2: v2}
		m, err := FromBinary(headers, body)
		if err != nil {
			var me *outbox.MalformedError
			if !errors.As(err, &me) || !maps.Equal(me.Attributes, headers) || !bytes.Equal(me.Body, body) {
				t.Fatalf("error %v does not keep the input", err)
			}
			return
		}
		if m.ID == uuid.Nil || m.Type == "" {
			t.Fatalf("decoded an event without ID or type: %+v", m)
		}
		// Written again, it is the same event.
		out, err := ToBinary(m, "/fuzz")
		if err != nil {
			return // a header that is not UTF-8
		}
		again, err := FromBinary(out, m.Body)
		if err != nil || again.ID != m.ID || again.Type != m.Type || again.Key != m.Key || !maps.Equal(again.Headers, m.Headers) {
			t.Fatalf("re-encoded %+v as %v: read back %+v, %v", m, out, again, err)
		}
	})
}
