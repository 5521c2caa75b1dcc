package outboxkafka

import (
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
)

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
	own := map[string]string{}
	for _, h := range r.Headers {
		own[h.Key] = string(h.Value)
	}
	f.Add(outboxtest.HeaderLines(own), string(r.Key), r.Value)
	for _, fm := range outboxtest.ForeignMessages() {
		f.Add(outboxtest.HeaderLines(fm.Headers), "", fm.Body)
	}
	f.Add("", "", []byte("not a CloudEvent"))
	f.Add("ce_id\t1\nce_id\t2\nCE-TYPE\tt\n", "key", []byte(`{"specversion":"1.0"}`))
	f.Fuzz(func(t *testing.T, lines, key string, value []byte) {
		rec := &kgo.Record{Topic: "t", Partition: 2, Offset: 7, Value: value}
		if key != "" {
			rec.Key = []byte(key)
		}
		for _, h := range outboxtest.ParseHeaderLines(lines) {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h[0], Value: []byte(h[1])})
		}
		got, err := decode(rec)
		if err != nil {
			raw := map[string]string{} // a repeated header's last value
			for _, h := range rec.Headers {
				raw[h.Key] = string(h.Value)
			}
			if err := outboxtest.CheckMalformed(err, raw, value, "t/2/7"); err != nil {
				t.Fatal(err)
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
