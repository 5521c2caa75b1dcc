package outboxazqueue

import (
	"encoding/base64"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
)

// FuzzDecode: any queue message text decodes to a message or to an *outbox.MalformedError
// that keeps the text byte for byte and the message ID, never a panic; and what encode
// writes, decode reads back as the same event, in both encodings. Seeds: our own messages
// and the structured-mode messages of the CloudEvents JavaScript SDK
// (outboxtest/testdata/cloudevents-js.json), as text and base64.
func FuzzDecode(f *testing.F) {
	m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: "a.b", Key: "k", ContentType: "application/json", Body: []byte(`{"n":1}`), CreatedAt: time.Unix(1, 0).UTC()}
	for _, enc := range []Encoding{Base64, Text} {
		text, err := encode(m, "", enc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(text)
	}
	for _, fm := range outboxtest.ForeignMessages() {
		if fm.Structured() {
			f.Add(string(fm.Body))
			f.Add(base64.StdEncoding.EncodeToString(fm.Body))
		}
	}
	f.Add("")
	f.Add("{")
	f.Add("not a CloudEvent")
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"specversion":"1.0"}`)))
	f.Fuzz(func(t *testing.T, text string) {
		got, err := decode("msg-1", []byte(text))
		if err != nil {
			if err := outboxtest.CheckMalformed(err, nil, []byte(text), "msg-1"); err != nil {
				t.Fatalf("decode(%q): %v", text, err)
			}
			return
		}
		if got.ID == uuid.Nil || got.Type == "" {
			t.Fatalf("decode(%q) gave an event without ID or type: %+v", text, got)
		}
		for _, enc := range []Encoding{Base64, Text} {
			again, err := encode(got, "", enc)
			if err != nil {
				continue // e.g. not UTF-8 for Text, or over the limit
			}
			back, err := decode("msg-2", []byte(again))
			if err != nil || back.ID != got.ID || back.Type != got.Type || back.Key != got.Key || !maps.Equal(back.Headers, got.Headers) {
				t.Fatalf("%v: re-encoding %q: got %+v, %v", enc, text, back, err)
			}
		}
	})
}
