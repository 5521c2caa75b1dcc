package outboxazqueue

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
)

// FuzzDecode: any queue message text decodes to a message or to an error wrapping
// outbox.ErrMalformed, never a panic; and what encode writes, decode reads back, in both
// encodings.
func FuzzDecode(f *testing.F) {
	m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: "a.b", Key: "k", ContentType: "application/json", Body: []byte(`{"n":1}`), CreatedAt: time.Unix(1, 0).UTC()}
	for _, enc := range []Encoding{Base64, Text} {
		text, err := encode(m, "", enc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(text)
	}
	f.Add("")
	f.Add("{")
	f.Add("not a CloudEvent")
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"specversion":"1.0"}`)))
	f.Fuzz(func(t *testing.T, text string) {
		got, err := decode(text)
		if err != nil {
			if !errors.Is(err, outbox.ErrMalformed) {
				t.Fatalf("decode(%q) error %v does not wrap ErrMalformed", text, err)
			}
			return
		}
		for _, enc := range []Encoding{Base64, Text} {
			again, err := encode(got, "", enc)
			if err != nil {
				continue // e.g. not UTF-8 for Text, or over the limit
			}
			back, err := decode(again)
			if err != nil || back.ID != got.ID || back.Type != got.Type || back.Key != got.Key {
				t.Fatalf("%v: re-encoding %q: got %+v, %v", enc, text, back, err)
			}
		}
	})
}
