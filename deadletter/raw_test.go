package deadletter_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/txoutbox/outbox/deadletter"
)

// TestRawRoundTrip: every byte of every field survives the raw column's text format, and
// the format stays readable (one line per field, the body verbatim at the end).
func TestRawRoundTrip(t *testing.T) {
	cases := []deadletter.Raw{
		{},
		{Body: []byte{}},
		{
			ID: "not-a-uuid", Type: "orders.placed\x00", Key: "k\xff\xfe", ContentType: "application/json",
			CreatedAt: "yesterday", HeadersText: `{"n": 1}`, Consumer: "c\n2", Reason: strings.Repeat("é", 300),
			BrokerMessageID: "sqs-1",
			Headers:         map[string]string{"a\x00": "b\xff", "": "empty name", "traceparent": "00-…"},
			Attributes:      map[string]string{"ce-id": "x", "line\nbreak": "\r\n"},
			Body:            []byte("\n\nbody\x00\xff\n"),
		},
	}
	for i, want := range cases {
		text, err := want.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got deadletter.Raw
		if err := got.UnmarshalText(text); err != nil {
			t.Fatalf("case %d: %v\n%s", i, err, text)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d: round trip changed it\nwant %#v\ngot  %#v", i, want, got)
		}
	}
	text, _ := cases[2].MarshalText()
	head, _, _ := strings.Cut(string(text), "\n\n")
	for _, line := range []string{`type: "orders.placed\x00"`, `header "traceparent": "00-…"`, `attribute "line\nbreak": "\r\n"`} {
		if !strings.Contains(head+"\n", "\n"+line+"\n") {
			t.Errorf("the text lacks the line %s:\n%s", line, head)
		}
	}
}

func TestRawRejectsOtherText(t *testing.T) {
	var r deadletter.Raw
	for _, bad := range []string{"", "hello", "txoutbox-raw/1\ntype: unquoted", "txoutbox-raw/1\nnope: \"x\"", "txoutbox-raw/1\nheader \"a\" \"b\""} {
		if err := r.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzRawRoundTrip(f *testing.F) {
	f.Add("t\x00", "k", "n", "v\xff", []byte("body"), true)
	f.Fuzz(func(t *testing.T, typ, key, name, value string, body []byte, withBody bool) {
		want := deadletter.Raw{Type: typ, Key: key, Headers: map[string]string{name: value}, Attributes: map[string]string{value: name}}
		if withBody {
			want.Body = append([]byte{}, body...)
		}
		text, _ := want.MarshalText()
		var got deadletter.Raw
		if err := got.UnmarshalText(text); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("want %#v\ngot  %#v", want, got)
		}
	})
}
