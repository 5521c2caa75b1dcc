package outboxazqueue_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/outboxtest"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// TestLimitBoundary proves the sender counts what the service counts: a message whose
// encoded text is exactly 64 KiB is accepted and comes back intact; one byte more is refused
// before sending.
func TestLimitBoundary(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	for _, enc := range []outboxazqueue.Encoding{outboxazqueue.Base64, outboxazqueue.Text} {
		name := newQueue(t, client)
		s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: name, Encoding: enc})
		if err != nil {
			t.Fatal(err)
		}
		limit := s.MaxMessageBytes()
		exact := msg("a.b", "")
		exact.Body = []byte(`""`)
		doc, err := cloudevents.ToStructured(exact, "")
		if err != nil {
			t.Fatal(err)
		}
		exact.Body = []byte(`"` + strings.Repeat("x", limit-len(doc)) + `"`)
		if doc, _ := cloudevents.ToStructured(exact, ""); len(doc) != limit {
			t.Fatalf("%v: built a %d-byte document, want %d", enc, len(doc), limit)
		}
		over := exact
		over.ID = msg("a.b", "").ID
		over.Body = []byte(`"` + strings.Repeat("x", limit-len(doc)+1) + `"`)

		err = s.Send(context.Background(), []outbox.Message{over, exact})
		var be *outbox.BatchError
		if !errors.As(err, &be) || len(be.Failed) != 1 || !errors.Is(be.Failed[0], outbox.ErrTooLarge) {
			t.Fatalf("%v: Send = %v, want only the message one byte over to fail with ErrTooLarge", enc, err)
		}
		r, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), fastReceiver)
		if err != nil {
			t.Fatal(err)
		}
		d := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
		got, err := d.Message()
		if err != nil {
			t.Fatal(err)
		}
		if err := outboxtest.SameMessage(got, exact); err != nil {
			t.Errorf("%v: %v", enc, err)
		}
		_ = d.Ack(context.Background())
	}
}

// TestPayloadsSurvive sends payloads that XML or a careless encoding would damage, in both
// encodings: markup, quotes, characters XML 1.0 cannot carry, emoji, and binary.
func TestPayloadsSurvive(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	jsonBody := []byte("{\"markup\": \"<a href='x'>&amp;</a> \\\" ]]>\", \"nonchars\": \"\uFFFE\uFFFF\", \"emoji\": \"😀\", \"ctl\": \"\\u0000\\r\\n\"}")
	binary := []byte{0, 1, 2, 0xff, 0xfe, '<', '&', '\r', '\n', 0xef, 0xbf, 0xbe}
	for _, enc := range []outboxazqueue.Encoding{outboxazqueue.Base64, outboxazqueue.Text} {
		name := newQueue(t, client)
		s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: name, Encoding: enc})
		if err != nil {
			t.Fatal(err)
		}
		j := msg("a.b", string(jsonBody))
		b := msg("a.b", "")
		b.ContentType, b.Body = "application/octet-stream", binary
		if err := s.Send(context.Background(), []outbox.Message{j, b}); err != nil {
			t.Fatal(err)
		}
		r, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), fastReceiver)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range outboxtest.ReceiveN(t, r, 2, 10*time.Second) {
			got, err := d.Message()
			if err != nil {
				t.Fatal(err)
			}
			switch got.ID {
			case j.ID: // JSON payloads are re-serialised by the CloudEvent document: same value
				var want, have any
				_ = json.Unmarshal(jsonBody, &want)
				if err := json.Unmarshal(got.Body, &have); err != nil || !reflect.DeepEqual(have, want) {
					t.Errorf("%v: JSON payload %q came back as %q (%v)", enc, jsonBody, got.Body, err)
				}
			case b.ID:
				if !bytes.Equal(got.Body, binary) {
					t.Errorf("%v: binary payload %q came back as %q", enc, binary, got.Body)
				}
			}
			_ = d.Ack(context.Background())
		}
	}
}

// TestTextRefusesInvalidUTF8: Text encoding cannot carry a JSON payload that is not UTF-8;
// it fails that message permanently instead of letting the SDK replace the bytes.
func TestTextRefusesInvalidUTF8(t *testing.T) {
	client := serviceClient(t)
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: "txo-never-created", Encoding: outboxazqueue.Text})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Send(context.Background(), []outbox.Message{msg("a.b", "\"\xff\"")})
	var be *outbox.BatchError
	if !errors.As(err, &be) || !outbox.IsPermanent(be.Failed[0]) || !strings.Contains(be.Failed[0].Error(), "not valid UTF-8") {
		t.Fatalf("Send = %v, want a permanent UTF-8 error", err)
	}
}

// TestReceiverReadsBothEncodings: a receiver reads text and base64 messages alike, so a
// sender can switch encodings without stranding what is queued.
func TestReceiverReadsBothEncodings(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	name := newQueue(t, client)
	q := client.NewQueueClient(name)
	m := msg("a.b", `{"n":1}`)
	doc, err := cloudevents.ToStructured(m, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{string(doc), base64.StdEncoding.EncodeToString(doc), " \n" + string(doc)} {
		if _, err := q.EnqueueMessage(context.Background(), text, nil); err != nil {
			t.Fatal(err)
		}
	}
	r, err := outboxazqueue.NewReceiver(q, fastReceiver)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range outboxtest.ReceiveN(t, r, 3, 10*time.Second) {
		got, err := d.Message()
		if err != nil || got.ID != m.ID {
			t.Errorf("Message() = %s, %v; want %s", got.ID, err, m.ID)
		}
		_ = d.Ack(context.Background())
	}
}
