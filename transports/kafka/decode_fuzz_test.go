package outboxkafka

import (
	"bytes"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
)

// headerLines writes record headers as the fuzz input spells them: "name\tvalue" lines.
func headerLines(hs []kgo.RecordHeader) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(h.Key + "\t" + string(h.Value) + "\n")
	}
	return b.String()
}

// FuzzDecode: any record (headers, key, value) decodes to an event or to an
// *outbox.MalformedError that keeps every header (a repeated one's last value) and the
// value byte for byte, and names the record, never a panic; a decoded event written by our
// encoder reads back as the same event. Seeds: our own records and the CloudEvents
// JavaScript SDK's messages (outboxtest/testdata).
func FuzzDecode(f *testing.F) {
	m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: "a.b", Key: "k", ContentType: "application/json",
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"},
		Body:    []byte(`{"n":1}`), CreatedAt: time.Unix(1, 0).UTC()}
	r, err := encode(m, "t", "/fuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(headerLines(r.Headers), string(r.Key), r.Value)
	for _, fm := range outboxtest.ForeignMessages() {
		var hs []kgo.RecordHeader
		for k, v := range fm.Headers {
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		f.Add(headerLines(hs), "", fm.Body)
	}
	f.Add("", "", []byte("not a CloudEvent"))
	f.Add("ce_id\t1\nce_id\t2\nCE-TYPE\tt\n", "key", []byte(`{"specversion":"1.0"}`))
	f.Fuzz(func(t *testing.T, lines, key string, value []byte) {
		rec := &kgo.Record{Topic: "t", Partition: 2, Offset: 7, Value: value}
		if key != "" {
			rec.Key = []byte(key)
		}
		for _, line := range strings.Split(lines, "\n") {
			if k, v, ok := strings.Cut(line, "\t"); ok {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
		}
		got, err := decode(rec)
		if err != nil {
			var me *outbox.MalformedError
			if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
				t.Fatalf("error %v is not an *outbox.MalformedError", err)
			}
			want := map[string]string{}
			for _, h := range rec.Headers {
				want[h.Key] = string(h.Value)
			}
			if !maps.Equal(me.Attributes, want) || !bytes.Equal(me.Body, value) || me.BrokerMessageID != "t/2/7" {
				t.Fatalf("the error keeps attributes %q body %q id %q; received %q %q", me.Attributes, me.Body, me.BrokerMessageID, want, value)
			}
			return
		}
		if got.ID == uuid.Nil || got.Type == "" {
			t.Fatalf("decoded an event without ID or type: %+v", got)
		}
		again, err := encode(got, "t", "/fuzz")
		if err != nil {
			return // a header that is not UTF-8 cannot be written
		}
		back, err := decode(again)
		if err != nil || back.ID != got.ID || back.Type != got.Type || back.Key != got.Key || !maps.Equal(back.Headers, got.Headers) {
			t.Fatalf("written again: read back %+v, %v; want %+v", back, err, got)
		}
	})
}
