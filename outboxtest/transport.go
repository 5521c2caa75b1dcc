package outboxtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

// Features say what a transport promises for a destination, as its test fixture declares
// them: the transport suites test each transport for what it promises, and skip what it
// does not.
type Features struct {
	// FIFO: messages with the same key are received in the order they were sent, retries
	// included.
	FIFO bool
	// Dedup: the broker drops a re-sent message with an ID it has seen recently.
	Dedup bool
	// Batch: the broker accepts several messages per call.
	Batch bool
	// Delay: Nack's delay is honoured by the broker.
	Delay bool
	// MaxMessageBytes is the largest encoded message the Sender accepts (0: no limit known).
	MaxMessageBytes int
}

// TransportFixture is one fresh, empty destination (queue, stream…) of the transport under
// test.
type TransportFixture struct {
	Sender   outbox.Sender
	Receiver outbox.Receiver
	// Features are what the transport promises for this destination.
	Features Features
	// SendRaw, when set, puts a body on the destination bypassing the wire format, with no
	// headers or attributes, to check that a malformed message reaches the consumer as an
	// *outbox.MalformedError that keeps it.
	SendRaw func(ctx context.Context, body []byte) error
	// SendForeign, when set, puts a message written by another CloudEvents producer on the
	// destination as that producer would: Headers as the broker's headers or attributes,
	// Body as the body. On a broker without headers it carries a structured-mode message
	// (m.Structured()) as its body alone, encoded as the broker's CloudEvents binding says,
	// and returns an error wrapping errors.ErrUnsupported for a message in binary mode.
	SendForeign func(ctx context.Context, m ForeignMessage) error
	// ReceiveForeign, when set, takes the next message off the destination as a consumer
	// using only the broker's own SDK sees it, and deletes it: its headers or attributes,
	// and its body decoded as the broker's binding says (Azure Queue's base64). The suite
	// checks with it that CloudEvents readers other than ours read what the Sender wrote.
	ReceiveForeign func(ctx context.Context) (ForeignMessage, error)
	// Timeout bounds each wait for a message. Default 10s.
	Timeout time.Duration
	// Outage, when set, returns a destination on a broker of the test's own, which the
	// Outage subtests stop and start again (called by those subtests only, so the other
	// subtests need no broker of their own): a Send while the broker is down must fail
	// with errors marked outbox.Unavailable for every message, go through once it is
	// back, and a message over the size limit must stay its own fault; with
	// OutageFixture.Pipeline, relays keep every event through an outage ten times longer
	// than their retry horizon and dead-letter none.
	Outage func(t *testing.T) *OutageFixture
}

// ExerciseTransport runs the transport conformance suite. newFixture is called once per
// subtest and must return an empty destination.
func ExerciseTransport(t *testing.T, newFixture func(t *testing.T) *TransportFixture) {
	t.Helper()
	fixture := func(t *testing.T) *TransportFixture {
		f := newFixture(t)
		if f.Timeout == 0 {
			f.Timeout = 10 * time.Second
		}
		return f
	}

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		want := []outbox.Message{
			testMessage("k1", `{"n":1}`),
			testMessage("", `{"n":2}`),
			testMessage("k2", `{"n":3}`),
		}
		want[0].Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
		mustSend(t, f, want...)
		// Ack each message as it arrives: a FIFO transport may hand out one at a time.
		got := map[uuid.UUID]outbox.Message{}
		attempts := map[uuid.UUID]int{}
		ReceiveEach(t, f.Receiver, len(want), f.Timeout, func(d outbox.Delivery) {
			m, err := d.Message()
			if err != nil {
				t.Fatalf("Message(): %v", err)
			}
			got[m.ID], attempts[m.ID] = m, d.Attempt()
			if err := d.Ack(context.Background()); err != nil {
				t.Fatalf("Ack: %v", err)
			}
		})
		for _, w := range want {
			m, ok := got[w.ID]
			if !ok {
				t.Fatalf("message %s not received", w.ID)
			}
			if err := SameMessage(m, w); err != nil {
				t.Error(err)
			}
			if attempts[w.ID] != 1 {
				t.Errorf("first delivery of %s has Attempt %d, want 1", w.ID, attempts[w.ID])
			}
		}
		ExpectNone(t, f.Receiver, 500*time.Millisecond)
	})

	t.Run("NackRedelivers", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		m := testMessage("", `{"n":1}`)
		mustSend(t, f, m)
		d := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
		if err := d.Nack(context.Background(), 0); err != nil {
			t.Fatalf("Nack: %v", err)
		}
		again := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
		got, _ := again.Message()
		if got.ID != m.ID || again.Attempt() != 2 {
			t.Fatalf("redelivery: id %s attempt %d, want %s attempt 2", got.ID, again.Attempt(), m.ID)
		}
		if err := again.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Batch", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		var msgs []outbox.Message
		for i := range 25 {
			msgs = append(msgs, testMessage("", fmt.Sprintf(`{"n":%d}`, i)))
		}
		mustSend(t, f, msgs...)
		seen := map[uuid.UUID]bool{}
		ReceiveEach(t, f.Receiver, len(msgs), f.Timeout, func(d outbox.Delivery) {
			m, _ := d.Message()
			seen[m.ID] = true
			_ = d.Ack(context.Background())
		})
		for _, m := range msgs {
			if !seen[m.ID] {
				t.Errorf("message %s of the batch was not received", m.ID)
			}
		}
	})

	t.Run("FIFO", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if !f.Features.FIFO {
			t.Skip("transport does not promise per-key order (Features.FIFO is false)")
		}
		var sent []outbox.Message
		for i := range 6 {
			m := testMessage("order-"+fmt.Sprint(i%2), fmt.Sprintf(`{"n":%d}`, i))
			sent = append(sent, m)
			mustSend(t, f, m) // one call each: the relay sends a key's messages in sequence
		}
		next := map[string]int{}
		for range sent {
			d := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
			m, _ := d.Message()
			var idx []int
			for i, s := range sent {
				if s.Key == m.Key {
					idx = append(idx, i)
				}
			}
			if want := sent[idx[next[m.Key]]]; want.ID != m.ID {
				t.Fatalf("key %s: got %s, want %s (out of order)", m.Key, m.Body, want.Body)
			}
			next[m.Key]++
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("Dedup", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if !f.Features.Dedup {
			t.Skip("transport does not dedup by ID (Features.Dedup is false)")
		}
		m := testMessage("k", `{"n":1}`)
		mustSend(t, f, m)
		mustSend(t, f, m) // a relay re-sending after a crash between send and delete
		d := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		ExpectNone(t, f.Receiver, time.Second)
	})

	t.Run("Delay", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if !f.Features.Delay {
			t.Skip("transport does not delay redelivery (Features.Delay is false)")
		}
		mustSend(t, f, testMessage("", `{"n":1}`))
		d := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
		start := time.Now()
		if err := d.Nack(context.Background(), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		ExpectNone(t, f.Receiver, time.Second)
		again := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
		if waited := time.Since(start); waited < time.Second {
			t.Fatalf("redelivered after %v, before the 2s delay", waited)
		}
		_ = again.Ack(context.Background())
	})

	t.Run("TooLarge", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if f.Features.MaxMessageBytes == 0 {
			t.Skip("transport states no size limit")
		}
		big := testMessage("", "")
		big.ContentType = "application/octet-stream"
		big.Body = bytes.Repeat([]byte{'x'}, f.Features.MaxMessageBytes+1)
		ok := testMessage("", `{"n":1}`)
		err := f.Sender.Send(context.Background(), []outbox.Message{big, ok})
		var be *outbox.BatchError
		if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[0] == nil {
			t.Fatalf("Send = %v, want a BatchError failing only message 0", err)
		}
		if !errors.Is(be.Failed[0], outbox.ErrTooLarge) || !outbox.IsPermanent(be.Failed[0]) {
			t.Fatalf("oversize error %v does not wrap outbox.ErrTooLarge", be.Failed[0])
		}
		if outbox.IsUnavailable(be.Failed[0]) {
			t.Fatalf("oversize error %v is marked as the broker's fault (outbox.IsUnavailable)", be.Failed[0])
		}
		d := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
		if m, _ := d.Message(); m.ID != ok.ID {
			t.Fatalf("received %s, want the valid message %s", m.ID, ok.ID)
		}
		_ = d.Ack(context.Background())
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if f.SendRaw == nil {
			t.Skip("fixture has no SendRaw")
		}
		// One destination, so one message at a time.
		t.Run("NotACloudEvent", func(t *testing.T) {
			body := []byte("this is not a CloudEvent")
			if err := f.SendRaw(context.Background(), body); err != nil {
				t.Fatal(err)
			}
			me := receiveMalformed(t, f)
			if !bytes.Equal(me.Body, body) {
				t.Errorf("MalformedError.Body %q, want the body as sent %q", me.Body, body)
			}
		})
		// What could be read is kept: id, type, key.
		wantPartial := func(t *testing.T, me *outbox.MalformedError) {
			t.Helper()
			p := me.Partial
			if p.ID != derivedID("/shop/orders", "bad-1") || p.Type != "shop.order.created" || p.Key != "order-9" {
				t.Errorf("MalformedError.Partial ID %s type %q key %q, want %s shop.order.created order-9",
					p.ID, p.Type, p.Key, derivedID("/shop/orders", "bad-1"))
			}
		}
		t.Run("StructuredOldSpec", func(t *testing.T) {
			doc := []byte(`{"specversion":"0.3","id":"bad-1","source":"/shop/orders","type":"shop.order.created","partitionkey":"order-9","data":{"order":9}}`)
			if err := f.SendRaw(context.Background(), doc); err != nil {
				t.Fatal(err)
			}
			me := receiveMalformed(t, f)
			if !bytes.Equal(me.Body, doc) {
				t.Errorf("MalformedError.Body %q, want the document as sent %q", me.Body, doc)
			}
			wantPartial(t, me)
		})
		t.Run("BinaryOldSpec", func(t *testing.T) {
			if f.SendForeign == nil {
				t.Skip("fixture has no SendForeign")
			}
			m := ForeignMessage{Name: "bad", Headers: map[string]string{
				"ce-specversion": "0.3", "ce-id": "bad-1", "ce-source": "/shop/orders", "ce-type": "shop.order.created",
				"ce-partitionkey": "order-9", "content-type": "application/json", "x-producer": "kept as is",
			}, Body: []byte(`{"order":9}`)}
			err := f.SendForeign(context.Background(), m)
			if errors.Is(err, errors.ErrUnsupported) {
				t.Skipf("the broker has no headers: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			me := receiveMalformed(t, f)
			if !bytes.Equal(me.Body, m.Body) {
				t.Errorf("MalformedError.Body %q, want %q", me.Body, m.Body)
			}
			for k, v := range m.Headers {
				if got, ok := me.Attributes[k]; !ok || got != v {
					t.Errorf("MalformedError.Attributes[%q] = %q, want %q as sent (all: %v)", k, got, v, me.Attributes)
				}
			}
			wantPartial(t, me)
		})
	})

	// Items of the CloudEvents JavaScript SDK, as a foreign producer puts them on the
	// broker: each must reach the consumer as the documented event (cloudevents's package
	// comment), and, written again by our Sender (forwarded, replayed), stay that event.
	t.Run("ForeignEvents", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if f.SendForeign == nil {
			t.Skip("fixture has no SendForeign")
		}
		resent := map[uuid.UUID]bool{}
		for _, fm := range ForeignMessages() {
			t.Run(fm.Name, func(t *testing.T) {
				err := f.SendForeign(context.Background(), fm)
				if errors.Is(err, errors.ErrUnsupported) {
					t.Skipf("the broker cannot carry it: %v", err)
				}
				if err != nil {
					t.Fatalf("SendForeign: %v", err)
				}
				m := receiveAcked(t, f)
				if err := checkForeign(fm.Name, m); err != nil {
					t.Fatal(err)
				}
				if f.Features.Dedup && resent[m.ID] {
					return // the same event came in another mode: the broker drops it as a copy
				}
				resent[m.ID] = true
				mustSend(t, f, m)
				again := receiveAcked(t, f)
				want := m
				want.ContentType = cmp.Or(m.ContentType, outbox.JSON.ContentType()) // written, absent means JSON
				if err := SameMessage(again, want); err != nil {
					t.Fatalf("written again by our Sender: %v", err)
				}
				if !maps.Equal(again.Headers, m.Headers) {
					t.Fatalf("written again by our Sender: headers %v, want %v", sortedMap(again.Headers), sortedMap(m.Headers))
				}
			})
		}
	})

	// Ping (an optional interface, which every transport of this repository implements)
	// answers while the broker is up, and sends nothing.
	t.Run("Ping", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		p, ok := f.Sender.(outbox.Pinger)
		if !ok {
			t.Skip("the Sender is not an outbox.Pinger")
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.Timeout)
		defer cancel()
		for i := range 2 { // once on a fresh Sender, once on one that has pinged
			if err := p.Ping(ctx); err != nil {
				t.Fatalf("Ping %d: %v", i+1, err)
			}
		}
		ExpectNone(t, f.Receiver, 300*time.Millisecond)
		cancelled, cancelNow := context.WithCancel(context.Background())
		cancelNow()
		if err := p.Ping(cancelled); err == nil {
			t.Error("Ping with a cancelled context succeeded, want ctx's error")
		}
	})

	t.Run("Outage", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if f.Outage == nil {
			t.Skip("fixture has no Outage (a broker the suite may stop)")
		}
		exerciseTransportOutage(t, f.Outage(t))
	})

	// A JSON payload with characters some brokers cannot carry as they are (U+FFFF, U+FFFE)
	// must still reach other CloudEvents readers as JSON under its JSON content type.
	t.Run("ForeignReadersParseOurJSON", func(t *testing.T) {
		t.Parallel()
		f := fixture(t)
		if f.ReceiveForeign == nil {
			t.Skip("fixture has no ReceiveForeign")
		}
		m := testMessage("k", "{\"note\":\"a\uffffb\ufffe\",\"html\":\"<&>\",\"n\":1.50}")
		mustSend(t, f, m)
		ctx, cancel := context.WithTimeout(context.Background(), f.Timeout)
		defer cancel()
		raw, err := f.ReceiveForeign(ctx)
		if err != nil {
			t.Fatalf("ReceiveForeign: %v", err)
		}
		attrs, data, err := readPlainCloudEvent(raw)
		if err != nil {
			t.Fatalf("reading %q (headers %v) as a CloudEvent: %v", raw.Body, raw.Headers, err)
		}
		if attrs["specversion"] != "1.0" || attrs["id"] != m.ID.String() || attrs["type"] != m.Type {
			t.Errorf("attributes %v, want specversion 1.0, id %s, type %s", attrs, m.ID, m.Type)
		}
		if ct := attrs["datacontenttype"]; !cloudevents.IsJSON(ct) || !json.Valid(data) || !sameJSONValue(data, m.Body) {
			t.Errorf("data %q under content type %q, want the JSON value %q", data, ct, m.Body)
		}
	})
}

// receiveAcked receives one delivery, acks it, and returns its message (failing the test
// if it has none).
func receiveAcked(t *testing.T, f *TransportFixture) outbox.Message {
	t.Helper()
	d := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
	m, err := d.Message()
	if ackErr := d.Ack(context.Background()); ackErr != nil {
		t.Fatalf("Ack: %v", ackErr)
	}
	if err != nil {
		t.Fatalf("Message(): %v", err)
	}
	return m
}

// receiveMalformed receives one delivery, acks it, and returns its *outbox.MalformedError,
// which must name the broker's message.
func receiveMalformed(t *testing.T, f *TransportFixture) *outbox.MalformedError {
	t.Helper()
	d := ReceiveN(t, f.Receiver, 1, f.Timeout)[0]
	_, err := d.Message()
	if ackErr := d.Ack(context.Background()); ackErr != nil {
		t.Fatalf("Ack: %v", ackErr)
	}
	var me *outbox.MalformedError
	if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
		t.Fatalf("Message() error = %v, want an *outbox.MalformedError", err)
	}
	if me.BrokerMessageID == "" {
		t.Errorf("MalformedError.BrokerMessageID is empty; it must name the broker's message")
	}
	return me
}

// readPlainCloudEvent reads m as a CloudEvents reader that knows nothing of txoutbox does:
// structured mode when its content type says so or it has no "ce-" (or, as in the Kafka
// binding, "ce_") headers, binary mode otherwise. It returns the attributes and the data.
func readPlainCloudEvent(m ForeignMessage) (map[string]string, []byte, error) {
	attrs := map[string]string{}
	var ct string
	for k, v := range m.Headers {
		switch lk := strings.ToLower(k); {
		case lk == "content-type":
			ct = v
		case strings.HasPrefix(lk, "ce-"), strings.HasPrefix(lk, "ce_"): // HTTP, NATS…; Kafka
			attrs[lk[3:]] = v
		}
	}
	if attrs["specversion"] != "" && !strings.HasPrefix(strings.ToLower(ct), cloudevents.StructuredContentType) {
		attrs["datacontenttype"] = ct
		return attrs, m.Body, nil
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(m.Body, &doc); err != nil {
		return nil, nil, fmt.Errorf("structured mode: %w", err)
	}
	attrs = map[string]string{}
	for k, v := range doc {
		var s string
		if json.Unmarshal(v, &s) == nil {
			attrs[k] = s
		}
	}
	return attrs, doc["data"], nil
}

// sameJSONValue reports whether a and b are the same JSON value.
func sameJSONValue(a, b []byte) bool {
	var va, vb any
	return json.Unmarshal(a, &va) == nil && json.Unmarshal(b, &vb) == nil && reflect.DeepEqual(va, vb)
}

func mustSend(t *testing.T, f *TransportFixture, msgs ...outbox.Message) {
	t.Helper()
	if err := f.Sender.Send(context.Background(), msgs); err != nil {
		t.Fatalf("Send: %v", err)
	}
}

func testMessage(key, body string) outbox.Message {
	return outbox.Message{
		ID:          uuid.Must(uuid.NewV7()),
		Type:        "outboxtest.event",
		Key:         key,
		ContentType: "application/json",
		Body:        []byte(body),
		CreatedAt:   time.Now().UTC().Truncate(time.Microsecond),
	}
}

// SameMessage reports how got differs from want (nil if it does not): every field, with
// times compared to the microsecond (what databases keep).
func SameMessage(got, want outbox.Message) error {
	var errs []error
	if got.ID != want.ID {
		errs = append(errs, fmt.Errorf("ID %s, want %s", got.ID, want.ID))
	}
	if got.Type != want.Type || got.Key != want.Key || got.ContentType != want.ContentType {
		errs = append(errs, fmt.Errorf("type/key/content-type %q/%q/%q, want %q/%q/%q", got.Type, got.Key, got.ContentType, want.Type, want.Key, want.ContentType))
	}
	if !bytes.Equal(got.Body, want.Body) {
		errs = append(errs, fmt.Errorf("body %q, want %q", got.Body, want.Body))
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			errs = append(errs, fmt.Errorf("header %q = %q, want %q", k, got.Headers[k], v))
		}
	}
	if !got.CreatedAt.Truncate(time.Microsecond).Equal(want.CreatedAt.Truncate(time.Microsecond)) {
		errs = append(errs, fmt.Errorf("CreatedAt %v, want %v", got.CreatedAt, want.CreatedAt))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("message %s: %w", want.ID, err)
	}
	return nil
}

// ReceiveN receives until it has n deliveries, failing the test if timeout passes first.
func ReceiveN(t testing.TB, r outbox.Receiver, n int, timeout time.Duration) []outbox.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []outbox.Delivery
	for len(out) < n {
		ds, err := r.Receive(ctx, n-len(out))
		if err != nil {
			t.Fatalf("received %d of %d messages, then: %v", len(out), n, err)
		}
		out = append(out, ds...)
	}
	return out
}

// Unsettled keeps deliveries received and not settled, for tests of how much a receiver
// hands out before anything is acknowledged (its byte cap).
type Unsettled struct {
	Deliveries []outbox.Delivery
	// Bytes adds up the bodies of Deliveries.
	Bytes int
}

// Receive calls r.Receive once, for up to max messages, keeps what it returns unsettled,
// and returns how many came. A failed Receive, or a delivery without a valid message,
// fails the test.
func (u *Unsettled) Receive(t testing.TB, r outbox.Receiver, max int) int {
	t.Helper()
	ds, err := r.Receive(context.Background(), max)
	if err != nil {
		t.Fatalf("Receive after %d unsettled deliveries: %v", len(u.Deliveries), err)
	}
	for _, d := range ds {
		m, err := d.Message()
		if err != nil {
			t.Fatalf("Message(): %v", err)
		}
		u.Deliveries, u.Bytes = append(u.Deliveries, d), u.Bytes+len(m.Body)
	}
	return len(ds)
}

// AckFrom acknowledges the deliveries from the i-th on.
func (u *Unsettled) AckFrom(t testing.TB, i int) {
	t.Helper()
	for _, d := range u.Deliveries[i:] {
		if err := d.Ack(context.Background()); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
}

// ReceiveEach receives n deliveries and hands each to fn as soon as it arrives (fn normally
// acks it), so it also works with transports that hand out one unacknowledged message at a
// time. It fails the test if timeout passes first.
func ReceiveEach(t testing.TB, r outbox.Receiver, n int, timeout time.Duration, fn func(outbox.Delivery)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for got := 0; got < n; {
		ds, err := r.Receive(ctx, n-got)
		if err != nil {
			t.Fatalf("received %d of %d messages, then: %v", got, n, err)
		}
		for _, d := range ds {
			fn(d)
		}
		got += len(ds)
	}
}

// ExpectNone fails the test if a message arrives within wait.
func ExpectNone(t testing.TB, r outbox.Receiver, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		ds, err := r.Receive(ctx, 10)
		if len(ds) > 0 {
			m, _ := ds[0].Message()
			t.Fatalf("expected no message, received %s (attempt %d)", m.ID, ds[0].Attempt())
		}
		if err != nil || ctx.Err() != nil {
			return
		}
	}
}
