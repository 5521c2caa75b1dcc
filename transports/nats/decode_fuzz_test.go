package outboxnats

import (
	"bytes"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	outboxce "github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/outboxtest"
)

// headerLines writes headers as the fuzz input spells them: one "name\tvalue" line each.
func headerLines(h map[string]string) string {
	var b strings.Builder
	for k, v := range h {
		b.WriteString(k + "\t" + v + "\n")
	}
	return b.String()
}

// parseHeaders reads fuzz input lines into a nats.Header; a name given twice gets two values.
func parseHeaders(lines string) nats.Header {
	h := nats.Header{}
	for _, line := range strings.Split(lines, "\n") {
		if k, v, ok := strings.Cut(line, "\t"); ok {
			h[k] = append(h[k], v)
		}
	}
	return h
}

// FuzzDecode: any headers and data decode to an event or to an *outbox.MalformedError that
// keeps every header (repeated values joined by "\n") and the data byte for byte, never a
// panic; a decoded event written by our encoder reads back as the same event. Seeds: our own
// messages and those of the CloudEvents JavaScript SDK (outboxtest/testdata).
func FuzzDecode(f *testing.F) {
	m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: "a.b", Key: "k", ContentType: "application/json",
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"},
		Body:    []byte(`{"n":1}`), CreatedAt: time.Unix(1, 0).UTC()}
	h, err := outboxce.ToBinary(m, "")
	if err != nil {
		f.Fatal(err)
	}
	h[jetstream.MsgIDHeader] = m.DedupID()
	f.Add(headerLines(h), m.Body)
	for _, fm := range outboxtest.ForeignMessages() {
		f.Add(headerLines(fm.Headers), fm.Body)
	}
	f.Add("", []byte("not a CloudEvent"))
	f.Add("ce-id\t1\nce-id\t2\nCE-TYPE\tt\n", []byte(`{"specversion":"1.0"}`))
	f.Fuzz(func(t *testing.T, lines string, data []byte) {
		hs := parseHeaders(lines)
		got, err := decode(hs, data, "S/1")
		if err != nil {
			var me *outbox.MalformedError
			if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
				t.Fatalf("error %v is not an *outbox.MalformedError", err)
			}
			want := map[string]string{}
			for k, vs := range hs {
				want[k] = strings.Join(vs, "\n")
			}
			if !maps.Equal(me.Attributes, want) || !bytes.Equal(me.Body, data) || me.BrokerMessageID != "S/1" {
				t.Fatalf("the error keeps attributes %q body %q id %q; received %q %q", me.Attributes, me.Body, me.BrokerMessageID, want, data)
			}
			return
		}
		if got.ID == uuid.Nil || got.Type == "" {
			t.Fatalf("decoded an event without ID or type: %+v", got)
		}
		out, err := outboxce.ToBinary(got, "/fuzz")
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
