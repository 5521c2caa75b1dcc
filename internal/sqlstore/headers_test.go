package sqlstore

import (
	"encoding/json"
	"maps"
	"testing"
)

var headerSeeds = []string{
	`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
	`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"a=1"}`,
	`{}`, ` { } `, `null`, `{"a": "b", "a": "c"}`, `{"a": "\u00e9"}`, `{"a": "é"}`, `{"a": 1}`,
	`{"a": null}`, `{"a": "b",}`, `{"a" "b"}`, `{"a": "b"} x`, `{"a": "b"`, `[]`, `"a"`, ``,
	`{"a": "tab	inside"}`, `{"<": "&"}`, "{\n\t\"a\" :\r\"b\"\n}",
}

// decodeHeaders must give what encoding/json gives, map and error alike, for any text.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range headerSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want map[string]string
		wantErr := json.Unmarshal([]byte(s), &want)
		got, err := decodeHeaders(s)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json %v", s, err, wantErr)
		}
		if err == nil && (!maps.Equal(got, want) || (got == nil) != (want == nil)) {
			t.Fatalf("%q: %#v, encoding/json %#v", s, got, want)
		}
	})
}

// HeadersJSON must write what json.Marshal writes, and decodeHeaders read it back.
func TestHeadersJSONIsMarshal(t *testing.T) {
	for _, h := range []map[string]string{
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"b": "2", "a": "1", "c": ""},
		{"quote": `say "hi"`}, {"html": "<a>&"}, {"é": "ü"}, {"ctl": "a\nb"}, {"": ""},
	} {
		want, _ := json.Marshal(h)
		got := HeadersJSON(h).(string)
		if got != string(want) {
			t.Errorf("HeadersJSON(%v) = %s, json.Marshal %s", h, got, want)
		}
		back, err := decodeHeaders(got)
		if err != nil || !maps.Equal(back, h) {
			t.Errorf("decodeHeaders(%s) = %v, %v", got, back, err)
		}
	}
	if HeadersJSON(nil) != nil {
		t.Error("HeadersJSON(nil) is not nil")
	}
}

func BenchmarkDecodeHeaders(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeHeaders(headerSeeds[0]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHeadersJSON(b *testing.B) {
	h := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	b.ReportAllocs()
	for b.Loop() {
		_ = HeadersJSON(h)
	}
}
