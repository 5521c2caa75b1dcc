package cloudevents

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
)

func sample() outbox.Message {
	return outbox.Message{
		ID:          uuid.Must(uuid.NewV7()),
		Type:        "orders.completed",
		Key:         "order-42",
		Headers:     map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Request-Id": "r1"},
		ContentType: "application/json",
		Body:        []byte(`{"order":42}`),
		CreatedAt:   time.Date(2026, 11, 22, 10, 0, 0, 123456000, time.UTC),
	}
}

func TestRoundTrip(t *testing.T) {
	m := sample()
	h, err := ToBinary(m, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := FromBinary(h, m.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("binary round trip:\n got %+v\nwant %+v", got, m)
	}
	doc, err := ToStructured(m, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err = FromStructured(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("structured round trip:\n got %+v\nwant %+v", got, m)
	}
	m.ContentType, m.Body = "application/octet-stream", []byte{0, 1, 2, 255}
	doc, _ = ToStructured(m, "")
	if got, err = FromStructured(doc); err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("binary payload: %v %+v", err, got)
	}
}

// TestSpecFieldNames reads our structured output with the CloudEvents spec's field names
// only, as a consumer in another language would.
func TestSpecFieldNames(t *testing.T) {
	m := sample()
	doc, _ := ToStructured(m, "/orders-service")
	var ce struct {
		SpecVersion     string          `json:"specversion"`
		ID              string          `json:"id"`
		Source          string          `json:"source"`
		Type            string          `json:"type"`
		Time            time.Time       `json:"time"`
		DataContentType string          `json:"datacontenttype"`
		PartitionKey    string          `json:"partitionkey"`
		TraceParent     string          `json:"traceparent"`
		Data            json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(doc, &ce); err != nil {
		t.Fatal(err)
	}
	if ce.SpecVersion != "1.0" || ce.ID != m.ID.String() || ce.Source != "/orders-service" || ce.Type != m.Type ||
		!ce.Time.Equal(m.CreatedAt) || ce.DataContentType != "application/json" || ce.PartitionKey != "order-42" ||
		ce.TraceParent != m.Headers["traceparent"] || string(ce.Data) != `{"order":42}` {
		t.Fatalf("spec fields: %+v", ce)
	}
}

func TestMalformed(t *testing.T) {
	for name, doc := range map[string]string{
		"not json":   `nope`,
		"no id":      `{"specversion":"1.0","type":"x","source":"s"}`,
		"empty id":   `{"specversion":"1.0","id":"","type":"x","source":"s"}`,
		"bad time":   `{"specversion":"1.0","id":"1","type":"x","source":"s","time":"yesterday"}`,
		"both data":  `{"specversion":"1.0","id":"1","type":"x","source":"s","data":1,"data_base64":"AA=="}`,
		"batch":      `[{"specversion":"1.0","id":"1","type":"x","source":"s"}]`,
		"no type":    `{"specversion":"1.0","id":"0191d1f0-0000-7000-8000-000000000000","source":"s"}`,
		"old spec":   `{"specversion":"0.3","id":"0191d1f0-0000-7000-8000-000000000000","type":"x","source":"s"}`,
		"bad base64": `{"specversion":"1.0","id":"0191d1f0-0000-7000-8000-000000000000","type":"x","source":"s","data_base64":"***"}`,
	} {
		if _, err := FromStructured([]byte(doc)); !errors.Is(err, outbox.ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	if _, err := FromBinary(map[string]string{"ce-type": "x"}, nil); !errors.Is(err, outbox.ErrMalformed) {
		t.Errorf("binary without id: %v", err)
	}
}

func FuzzFromStructured(f *testing.F) {
	doc, _ := ToStructured(sample(), "")
	f.Add(doc)
	f.Add([]byte(`{"specversion":"1.0","id":"0191d1f0-0000-7000-8000-000000000000","type":"x","data_base64":"AAE="}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		m, err := FromStructured(doc)
		if err != nil {
			if !errors.Is(err, outbox.ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		again, err := ToStructured(m, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := FromStructured(again); err != nil {
			t.Fatalf("re-decoding our own output: %v", err)
		}
	})
}

func TestStructuredKeepsJSONBytes(t *testing.T) {
	m := sample()
	m.Body = []byte(`{ "html": "<b>&</b>",   "n": 1.50 }`)
	doc, err := ToStructured(m, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := FromStructured(doc)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Body) != string(m.Body) {
		t.Fatalf("payload bytes changed:\n got %s\nwant %s", got.Body, m.Body)
	}
	if !json.Valid(doc) {
		t.Fatalf("invalid document %s", doc)
	}
}

func TestInvalidUTF8HeaderIsAnError(t *testing.T) {
	m := sample()
	m.Headers = map[string]string{"X-Bad": "\xff"}
	if _, err := ToBinary(m, ""); err == nil {
		t.Fatal("a non-UTF-8 header was accepted (it would arrive changed)")
	}
	if _, err := ToStructured(m, ""); err == nil {
		t.Fatal("a non-UTF-8 header was accepted in structured mode")
	}
}

// TestBinaryHeaders pins the binary-mode headers: each attribute under "ce-" + its name,
// datacontenttype as content-type.
func TestBinaryHeaders(t *testing.T) {
	m := sample()
	h, err := ToBinary(m, "/orders-service")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ce-specversion":  "1.0",
		"ce-id":           m.ID.String(),
		"ce-type":         "orders.completed",
		"ce-source":       "/orders-service",
		"ce-time":         "2026-11-22T10:00:00.123456Z",
		"content-type":    "application/json",
		"ce-partitionkey": "order-42",
		"ce-traceparent":  m.Headers["traceparent"],
		"ce-txheaders":    `{"X-Request-Id":"r1"}`,
	}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("binary headers:\n got %v\nwant %v", h, want)
	}
	attrs, err := attributes(m, "/orders-service")
	if err != nil {
		t.Fatal(err)
	}
	if len(attrs) != len(h) {
		t.Fatalf("%d attributes, %d binary headers", len(attrs), len(h))
	}
	for k, v := range attrs {
		name := HeaderPrefix + k
		if k == "datacontenttype" {
			name = ContentTypeHeader
		}
		if h[name] != v {
			t.Errorf("attribute %s = %q, header %s = %q", k, v, name, h[name])
		}
	}
	got := map[string]string{}
	if err := EachBinary(m, "/orders-service", func(k, v string) {
		if _, dup := got[k]; dup {
			t.Errorf("header %s given twice", k)
		}
		got[k] = v
	}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("EachBinary: %v\n got %v\nwant %v", err, got, want)
	}
}
