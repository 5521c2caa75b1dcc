package outboxnats

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/outboxtest"
)

// FuzzDecode: any headers and data decode to an event or to an *outbox.MalformedError that
// keeps every header (repeated values joined by "\n") and the data byte for byte, never a
// panic; a decoded event written by our encoder reads back as the same event. Seeds: our own
// messages and those of the CloudEvents JavaScript SDK (outboxtest/testdata).
func FuzzDecode(f *testing.F) {
	m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: "a.b", Key: "k", ContentType: "application/json",
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"},
		Body:    []byte(`{"n":1}`), CreatedAt: time.Unix(1, 0).UTC()}
	h, err := cloudevents.ToBinary(m, "")
	if err != nil {
		f.Fatal(err)
	}
	h[jetstream.MsgIDHeader] = m.DedupID()
	f.Add(outboxtest.HeaderLines(h), m.Body)
	for _, fm := range outboxtest.ForeignMessages() {
		f.Add(outboxtest.HeaderLines(fm.Headers), fm.Body)
	}
	f.Add("", []byte("not a CloudEvent"))
	f.Add("ce-id\t1\nce-id\t2\nCE-TYPE\tt\n", []byte(`{"specversion":"1.0"}`))
	f.Fuzz(func(t *testing.T, lines string, data []byte) {
		hs := nats.Header{}
		for _, h := range outboxtest.ParseHeaderLines(lines) {
			hs[h[0]] = append(hs[h[0]], h[1])
		}
		got, err := decode(hs, data, "S/1")
		if err != nil {
			raw := map[string]string{} // a repeated header's values joined by "\n"
			for k, vs := range hs {
				raw[k] = strings.Join(vs, "\n")
			}
			if err := outboxtest.CheckMalformed(err, raw, data, "S/1"); err != nil {
				t.Fatal(err)
			}
			return
		}
		if got.ID == uuid.Nil || got.Type == "" {
			t.Fatalf("decoded an event without ID or type: %+v", got)
		}
		out, err := cloudevents.ToBinary(got, "/fuzz")
		if err != nil {
			return // a header that is not UTF-8 cannot be written
		}
		again := nats.Header{}
		for k, v := range out {
			again[k] = []string{v}
		}
		back, err := decode(again, got.Body, "S/2")
		if err != nil || back.ID != got.ID || back.Type != got.Type || back.Key != got.Key || !maps.Equal(back.Headers, got.Headers) {
			t.Fatalf("written again as %v: read back %+v, %v; want %+v", out, back, err, got)
		}
	})
}
