package outboxnats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

func message(typ, key, body string) outbox.Message {
	return outbox.Message{
		ID:          uuid.Must(uuid.NewV7()),
		Type:        typ,
		Key:         key,
		ContentType: "application/json",
		Body:        []byte(body),
		CreatedAt:   time.Now().UTC(),
	}
}

// failedAt returns the error of message i in a Send result that must be a BatchError.
func failedAt(t *testing.T, err error, i int) error {
	t.Helper()
	var be *outbox.BatchError
	if !errors.As(err, &be) || be.Failed[i] == nil {
		t.Fatalf("Send = %v, want a BatchError failing message %d", err, i)
	}
	return be.Failed[i]
}

func TestNewSenderReportsEveryProblem(t *testing.T) {
	nc, js := connect(t)
	_, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{
		SubjectPrefix:   "bad prefix",
		Subjects:        map[string]string{"": "ok.subject", "orders.created": "orders.*"},
		Stream:          "has.dot",
		Source:          " /padded",
		MaxMessageBytes: int(nc.MaxPayload()) + 1,
		MaxPending:      -1,
	})
	if err == nil {
		t.Fatal("NewSender accepted an invalid config")
	}
	for _, want := range []string{
		`SubjectPrefix "bad prefix"`, `empty event type`, `Subjects["orders.created"] = "orders.*"`,
		`Stream "has.dot"`, `Source " /padded"`, `over the server's max payload`, `MaxPending -1`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}

	_, err = outboxnats.NewSender(js, &outboxnats.SenderConfig{
		Subject:       func(outbox.Message) string { return "x" },
		SubjectPrefix: "events",
	})
	if err == nil || !strings.Contains(err.Error(), "set one way of routing") {
		t.Errorf("Subject with SubjectPrefix: err = %v", err)
	}
	if _, err := outboxnats.NewSender(nil, nil); err == nil {
		t.Error("NewSender(nil) succeeded")
	}
}

func TestSubjectFor(t *testing.T) {
	_, js := connect(t)
	s, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{
		Subjects: map[string]string{"orders.created": "orders.v1.created"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for typ, want := range map[string]string{
		"orders.created":        "orders.v1.created",
		"files.parse_requested": "events.files.parse_requested",
	} {
		if got, err := s.SubjectFor(message(typ, "", "{}")); err != nil || got != want {
			t.Errorf("SubjectFor(%q) = %q, %v; want %q", typ, got, err, want)
		}
	}
	for _, typ := range []string{"has space", "trailing.", "a..b", "wild.*", "tail.>"} {
		_, err := s.SubjectFor(message(typ, "", "{}"))
		if err == nil || !outbox.IsPermanent(err) {
			t.Errorf("SubjectFor(%q) = %v, want a permanent error", typ, err)
		}
	}

	byTenant, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{
		Subject: func(m outbox.Message) string { return "tenants." + m.Headers["tenant"] + "." + m.Type },
	})
	if err != nil {
		t.Fatal(err)
	}
	m := message("orders.created", "", "{}")
	m.Headers = map[string]string{"tenant": "acme"}
	if got, _ := byTenant.SubjectFor(m); got != "tenants.acme.orders.created" {
		t.Errorf("custom Subject: got %q", got)
	}
}

// TestSendRefusesWhatHeadersWouldChange checks that values nats.go would trim or rewrite
// fail permanently instead of arriving altered, and do not fail the rest of the batch.
func TestSendRefusesWhatHeadersWouldChange(t *testing.T) {
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	broken := message("t", "", "{}")
	broken.Headers = map[string]string{"tenant": "acme\r\nX-Injected: 1"}
	padded := message("t", "key ", "{}")
	ok := message("t", "", "{}")
	err := d.sender.Send(context.Background(), []outbox.Message{broken, padded, ok})
	for i, want := range []string{"header ce-tenant", "header ce-partitionkey"} {
		e := failedAt(t, err, i)
		if !outbox.IsPermanent(e) || !strings.Contains(e.Error(), want) {
			t.Errorf("message %d: %v, want a permanent error naming %s", i, e, want)
		}
	}
	if got := streamMsgs(t, d.stream); got != 1 {
		t.Errorf("stream holds %d messages, want only the valid one", got)
	}
}

// TestSizeLimitIsExact proves the size check counts what the server counts: a message of
// exactly the server's max payload (headers and body) is stored, one byte more is refused
// before sending, with an error naming the limit.
func TestSizeLimitIsExact(t *testing.T) {
	nc, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	limit := int(nc.MaxPayload())
	if got := d.sender.MaxMessageBytes(); got != limit {
		t.Fatalf("MaxMessageBytes() = %d, want the server's %d", got, limit)
	}

	fits := message("blob", "", "")
	fits.ContentType = "application/octet-stream"
	headers, err := outboxnats.EncodedSize(d.sender, fits)
	if err != nil {
		t.Fatal(err)
	}
	fits.Body = bytes.Repeat([]byte{'x'}, limit-headers)
	if err := d.sender.Send(context.Background(), []outbox.Message{fits}); err != nil {
		t.Fatalf("a message of exactly the max payload (%d bytes) was refused: %v", limit, err)
	}

	over := fits
	over.ID = uuid.Must(uuid.NewV7())
	over.Body = append(bytes.Clone(fits.Body), 'x')
	e := failedAt(t, d.sender.Send(context.Background(), []outbox.Message{over}), 0)
	if !errors.Is(e, outbox.ErrTooLarge) {
		t.Fatalf("over the limit: %v does not wrap outbox.ErrTooLarge", e)
	}
	for _, want := range []string{over.ID.String(), "the server's max payload", "1048576 bytes (1 MiB)"} {
		if limit == 1<<20 && !strings.Contains(e.Error(), want) {
			t.Errorf("error %q does not name %q", e, want)
		}
	}
	if got := streamMsgs(t, d.stream); got != 1 {
		t.Errorf("stream holds %d messages, want 1", got)
	}
}

func TestConfiguredMaxMessageBytes(t *testing.T) {
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{MaxMessageBytes: 2048})
	big := message("t", "", `"`+strings.Repeat("x", 3000)+`"`)
	e := failedAt(t, d.sender.Send(context.Background(), []outbox.Message{big, message("t", "", "{}")}), 0)
	if !errors.Is(e, outbox.ErrTooLarge) || !strings.Contains(e.Error(), "the configured MaxMessageBytes of 2048 bytes (2 KiB)") {
		t.Fatalf("error %v: want outbox.ErrTooLarge naming the configured limit", e)
	}
}

// TestSendToNoStream: a subject no stream captures (yet) fails the message as the
// broker's fault (outbox.Unavailable: the relay waits for the stream, spending no
// attempt), naming the subject, once the no-responders retries are spent (two, 250 ms
// apart, as nats.go's).
func TestSendToNoStream(t *testing.T) {
	_, js := connect(t)
	s, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{SubjectPrefix: "nostream." + unique()})
	if err != nil {
		t.Fatal(err)
	}
	e := failedAt(t, s.Send(context.Background(), []outbox.Message{message("t", "", "{}")}), 0)
	if !outbox.IsUnavailable(e) || !errors.Is(e, jetstream.ErrNoStreamResponse) || !strings.Contains(e.Error(), "no stream captures subject nostream.") {
		t.Fatalf("error %v: want an error marked unavailable naming the subject", e)
	}
}

// TestFullStreamIsUnavailable: a stream at its limits that discards new messages refuses
// a publish with a 503 API error ("maximum messages exceeded"): the stream's state, not the
// message's fault, so the relay waits until consumers make room.
func TestFullStreamIsUnavailable(t *testing.T) {
	_, js := connect(t)
	id := unique()
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUTBOXTEST_FULL_" + id, Subjects: []string{"full." + id + ".>"},
		Storage: jetstream.MemoryStorage, MaxMsgs: 1, Discard: jetstream.DiscardNew})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), "OUTBOXTEST_FULL_"+id) })
	s, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{SubjectPrefix: "full." + id})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(ctx, []outbox.Message{message("t", "", "{}")}); err != nil {
		t.Fatal(err)
	}
	e := failedAt(t, s.Send(ctx, []outbox.Message{message("t", "", "{}")}), 0)
	var api *jetstream.APIError
	if !outbox.IsUnavailable(e) || !errors.As(e, &api) || api.Code != 503 {
		t.Fatalf("error %v: want the stream's 503 marked unavailable", e)
	}
}

func TestSendHonoursContext(t *testing.T) {
	_, js := connect(t)
	s, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{SubjectPrefix: "nostream." + unique()})
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Send(cancelled, []outbox.Message{message("t", "", "{}")}); !errors.Is(err, context.Canceled) {
		t.Errorf("Send with a cancelled context = %v", err)
	}

	// No stream answers, so the ack never comes before the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	e := failedAt(t, s.Send(ctx, []outbox.Message{message("t", "", "{}")}), 0)
	if !errors.Is(e, context.DeadlineExceeded) || !strings.Contains(e.Error(), "no ack from the stream") {
		t.Errorf("Send past its deadline: %v", e)
	}
}

func TestSendWhileDisconnected(t *testing.T) {
	nc, js := connect(t)
	s, err := outboxnats.NewSender(js, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	err = s.Send(context.Background(), []outbox.Message{message("t", "", "{}"), message("t", "", "{}")})
	var be *outbox.BatchError
	if err == nil || errors.As(err, &be) || !errors.Is(err, nats.ErrDisconnected) {
		t.Fatalf("Send on a closed connection = %v, want one error for the whole batch", err)
	}
}

// TestSendKeepsMaxPendingInFlight: with MaxPending 3, the Sender publishes message k only
// after the stream acknowledged message k-3. A fake stream (a core NATS responder) releases
// its acks one at a time, each only once the messages it allows have arrived; the stream's
// answers ("stored", an API error, and a duplicate counting as stored) reach the result.
func TestSendKeepsMaxPendingInFlight(t *testing.T) {
	t.Parallel()
	nc, js := connect(t)
	prefix := "fakestream." + unique()
	s, err := outboxnats.NewSender(js, &outboxnats.SenderConfig{SubjectPrefix: prefix, MaxPending: 3})
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	var (
		mu       sync.Mutex
		received []*nats.Msg
		acked    int
		overrun  string
	)
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		received = append(received, m)
		if k := len(received); k > acked+3 && overrun == "" {
			overrun = fmt.Sprintf("message %d arrived with only %d acked", k, acked)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = message("t", "", "{}")
	}
	sent := make(chan error, 1)
	go func() { sent <- s.Send(context.Background(), msgs) }()
	for i := range n {
		outboxtest.WaitFor(t, 10*time.Second, "the messages the window allows", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(received) >= min(i+3, n)
		})
		mu.Lock()
		m := received[i]
		acked++
		mu.Unlock()
		ack := fmt.Sprintf(`{"stream":"FAKE","seq":%d}`, i+1)
		switch i {
		case 4:
			ack = `{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`
		case 7:
			ack = `{"stream":"FAKE","seq":7,"duplicate":true}`
		}
		if err := m.Respond([]byte(ack)); err != nil {
			t.Fatal(err)
		}
	}
	err = <-sent
	mu.Lock()
	defer mu.Unlock()
	if overrun != "" {
		t.Fatalf("more than MaxPending in flight: %s", overrun)
	}
	var be *outbox.BatchError
	var api *jetstream.APIError
	if !errors.As(err, &be) || len(be.Failed) != 1 || !errors.As(be.Failed[4], &api) || api.ErrorCode != 10077 {
		t.Fatalf("Send = %v, want message 4 alone failed with the stream's API error", err)
	}
}
