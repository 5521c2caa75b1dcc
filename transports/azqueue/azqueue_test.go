package outboxazqueue_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
)

// transport is shared by every client the tests make, so TestMain can close its idle
// connections before checking for leaked goroutines.
var transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}

func TestMain(m *testing.M) {
	code := m.Run()
	transport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// serviceClient returns a client of the emulator, or skips (fails with CI set) when it is
// not reachable.
func serviceClient(t testing.TB) *azqueue.ServiceClient {
	t.Helper()
	return serviceClientAt(t, outboxtest.AzuriteConnString())
}

// serviceClientAt returns a client of the queue service that conn names.
func serviceClientAt(t testing.TB, conn string) *azqueue.ServiceClient {
	t.Helper()
	client, err := azqueue.NewServiceClientFromConnectionString(conn, &azqueue.ClientOptions{
		ClientOptions: azcore.ClientOptions{
			Transport: &http.Client{Transport: transport},
			Retry:     policy.RetryOptions{MaxRetries: 2, RetryDelay: 50 * time.Millisecond},
		},
	})
	if err != nil {
		t.Fatalf("azqueue client: %v", err)
	}
	return client
}

// newQueue creates a uniquely named, empty queue and deletes it when the test ends.
func newQueue(t testing.TB, client *azqueue.ServiceClient) string {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "txo-" + strings.ToLower(hex.EncodeToString(b))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.CreateQueue(ctx, name, nil); err != nil {
		outboxtest.RequireService(t, "Azurite (Azure Queue Storage)", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := client.DeleteQueue(ctx, name, nil); err != nil {
			t.Errorf("deleting queue %s: %v", name, err)
		}
	})
	return name
}

// fastReceiver polls quickly, as tests want; production defaults poll more gently.
var fastReceiver = &outboxazqueue.ReceiverConfig{MinPollInterval: 5 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond, WaitTime: time.Second}

func TestConformance(t *testing.T) {
	for _, enc := range []outboxazqueue.Encoding{outboxazqueue.Base64, outboxazqueue.Text} {
		t.Run(enc.String(), func(t *testing.T) {
			t.Parallel()
			client := serviceClient(t)
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				name := newQueue(t, client)
				s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: name, Encoding: enc})
				if err != nil {
					t.Fatal(err)
				}
				q := client.NewQueueClient(name)
				r, err := outboxazqueue.NewReceiver(q, fastReceiver)
				if err != nil {
					t.Fatal(err)
				}
				return &outboxtest.TransportFixture{
					Outage:   func(t *testing.T) *outboxtest.OutageFixture { return azuriteOutage(t, enc) },
					Sender:   s,
					Receiver: r,
					Features: features(s),
					Timeout:  30 * time.Second, // Azurite is one Node process, shared on a busy machine
					SendRaw: func(ctx context.Context, body []byte) error {
						_, err := q.EnqueueMessage(ctx, string(body), nil)
						return err
					},
					// A producer on Azure Queue writes a structured-mode document, base64 or
					// not as its SDK's encoding policy says: the same as this variant's sender.
					SendForeign: func(ctx context.Context, m outboxtest.ForeignMessage) error {
						if !m.Structured() {
							return fmt.Errorf("Azure Queue messages have no headers for binary mode: %w", errors.ErrUnsupported)
						}
						text := string(m.Body)
						if enc == outboxazqueue.Base64 {
							text = base64.StdEncoding.EncodeToString(m.Body)
						}
						_, err := q.EnqueueMessage(ctx, text, nil)
						return err
					},
					ReceiveForeign: func(ctx context.Context) (outboxtest.ForeignMessage, error) {
						return receiveForeign(ctx, q, enc)
					},
				}
			})
		})
	}
}

// azuriteOutage is a queue on a private Azurite, which the suite kills and starts again on
// the same port; it keeps nothing in memory across the restart, so Start creates the queue
// again, as the infrastructure would (in between, a Send meets a queue that does not
// features are what Azure Queue Storage promises: no per-key order, no dedup, no batch
// API, delayed redelivery (the visibility timeout), and s's size limit.
func features(s *outboxazqueue.Sender) outboxtest.Features {
	return outboxtest.Features{Delay: true, MaxMessageBytes: s.MaxMessageBytes()}
}

// exist).
func azuriteOutage(t *testing.T, enc outboxazqueue.Encoding) *outboxtest.OutageFixture {
	azurite := outboxtest.StartNodeProcess(t, "azurite", "azurite", func(dir string, port int) ([]string, []string) {
		return []string{"node_modules/azurite/dist/src/queue/main.js", "--queueHost", "127.0.0.1",
			"--queuePort", strconv.Itoa(port), "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--silent"}, nil
	})
	// The private instance's own address, whatever TXOUTBOX_AZURITE_CONN names.
	client := serviceClientAt(t, outboxtest.AzuriteDevConnString(azurite.Port))
	name := newQueue(t, client)
	create := func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := client.CreateQueue(ctx, name, nil); err != nil {
			t.Fatalf("creating queue %s again: %v", name, err)
		}
	}
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: name, Encoding: enc})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), fastReceiver)
	if err != nil {
		t.Fatal(err)
	}
	return &outboxtest.OutageFixture{
		Sender:   s,
		Receiver: r,
		Features: features(s),
		Stop:     func(testing.TB) { azurite.Kill() },
		Start: func(t testing.TB) {
			azurite.Start()
			create(t)
		},
		Pipeline: func(t *testing.T) *outboxtest.PipelineFixture {
			return pgxtest.New(t, "outboxazqueue").Pipeline(t, s, r)
		},
		Timeout: 90 * time.Second, // Azurite is one Node process, on a busy machine
	}
}

// receiveForeign takes the next message off q with the Azure SDK alone, decoding it as an
// Azure Functions queue trigger with the variant's messageEncoding would, and deletes it.
func receiveForeign(ctx context.Context, q *azqueue.QueueClient, enc outboxazqueue.Encoding) (outboxtest.ForeignMessage, error) {
	for {
		resp, err := q.DequeueMessage(ctx, nil)
		if err != nil {
			return outboxtest.ForeignMessage{}, err
		}
		if len(resp.Messages) == 0 {
			select {
			case <-ctx.Done():
				return outboxtest.ForeignMessage{}, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		msg := resp.Messages[0]
		if _, err := q.DeleteMessage(ctx, *msg.MessageID, *msg.PopReceipt, nil); err != nil {
			return outboxtest.ForeignMessage{}, err
		}
		body := []byte(*msg.MessageText)
		if enc == outboxazqueue.Base64 {
			if body, err = base64.StdEncoding.DecodeString(*msg.MessageText); err != nil {
				return outboxtest.ForeignMessage{}, err
			}
		}
		return outboxtest.ForeignMessage{Body: body}, nil
	}
}

// TestRouting sends events of three types through one sender: two routed, one to the
// default queue.
func TestRouting(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	orders, files, rest := newQueue(t, client), newQueue(t, client), newQueue(t, client)
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{
		DefaultQueue: rest,
		Routes:       map[string]string{"orders.created": orders, "files.parse_requested": files},
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{msg("orders.created", `{}`), msg("files.parse_requested", `{}`), msg("users.signed_up", `{}`)}
	if err := s.Send(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	for i, queue := range []string{orders, files, rest} {
		r, err := outboxazqueue.NewReceiver(client.NewQueueClient(queue), fastReceiver)
		if err != nil {
			t.Fatal(err)
		}
		d := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
		if m, err := d.Message(); err != nil || m.ID != msgs[i].ID {
			t.Errorf("queue %s: got %v (%v), want message %s of type %s", queue, m.ID, err, msgs[i].ID, msgs[i].Type)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoRoute: with no default queue, an unrouted event fails alone, permanently.
func TestNoRoute(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	orders := newQueue(t, client)
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{Routes: map[string]string{"orders.created": orders}})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Send(context.Background(), []outbox.Message{msg("orders.created", `{}`), msg("users.signed_up", `{}`)})
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[1] == nil {
		t.Fatalf("Send = %v, want a BatchError failing message 1 only", err)
	}
	if !errors.Is(be.Failed[1], outboxazqueue.ErrNoRoute) || !outbox.IsPermanent(be.Failed[1]) {
		t.Fatalf("error %v: want permanent ErrNoRoute", be.Failed[1])
	}
	if !strings.Contains(be.Failed[1].Error(), `"users.signed_up"`) {
		t.Errorf("error %q does not name the event type", be.Failed[1])
	}
}

// TestQueueNotFound: a missing queue fails the message as the broker's fault
// (outbox.Unavailable: the relay waits for the queue, spending no attempt), naming it.
func TestQueueNotFound(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	newQueue(t, client) // proves the service is up (or skips)
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: "txo-does-not-exist"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Send(context.Background(), []outbox.Message{msg("a.b", `{}`)})
	var be *outbox.BatchError
	if !errors.As(err, &be) || be.Failed[0] == nil || !outbox.IsUnavailable(be.Failed[0]) {
		t.Fatalf("Send = %v, want a failure of message 0 marked unavailable", err)
	}
	if !strings.Contains(err.Error(), `queue "txo-does-not-exist" does not exist`) {
		t.Errorf("error %q does not name the missing queue", err)
	}
}

// TestCreateQueues creates every routed queue, and tolerates queues that exist.
func TestCreateQueues(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	existing := newQueue(t, client)
	fresh := existing + "-new"
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: existing, Routes: map[string]string{"a.b": fresh}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = client.DeleteQueue(context.Background(), fresh, nil) })
	for range 2 {
		if err := s.CreateQueues(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Send(context.Background(), []outbox.Message{msg("a.b", `{}`)}); err != nil {
		t.Fatal(err)
	}
}

// TestStaleReceipt: a delivery whose visibility timeout ran out, and that another receive
// took over, cannot be acked or nacked any more; the error says why.
func TestStaleReceipt(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	name := newQueue(t, client)
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: name})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), &outboxazqueue.ReceiverConfig{
		VisibilityTimeout: time.Second, MinPollInterval: 50 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond, WaitTime: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := msg("a.b", `{"n":1}`)
	if err := s.Send(context.Background(), []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}
	first := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0]
	second := outboxtest.ReceiveN(t, r, 1, 10*time.Second)[0] // after first's 1s visibility ended
	if second.Attempt() != 2 {
		t.Fatalf("second delivery has Attempt %d, want 2", second.Attempt())
	}
	for op, call := range map[string]func(context.Context) error{
		"Ack":  first.Ack,
		"Nack": func(ctx context.Context) error { return first.Nack(ctx, 0) },
	} {
		err := call(context.Background())
		if !errors.Is(err, outboxazqueue.ErrVisibilityExpired) {
			t.Fatalf("%s with a stale receipt = %v, want ErrVisibilityExpired", op, err)
		}
		if !strings.Contains(err.Error(), m.ID.String()) || !strings.Contains(err.Error(), "visibility timeout of 1s expired") {
			t.Errorf("%s error %q should name the event and the visibility timeout", op, err)
		}
	}
	// The current holder still controls the message, also after a Nack renewed its receipt.
	if err := second.Nack(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := second.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	outboxtest.ExpectNone(t, r, 1500*time.Millisecond)
}

// TestReceiveMoreThan32 takes more than one Get Messages request's worth in one Receive.
func TestReceiveMoreThan32(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	name := newQueue(t, client)
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: name, Concurrency: 20})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]outbox.Message, 70)
	for i := range msgs {
		msgs[i] = msg("a.b", fmt.Sprintf(`{"n":%d}`, i))
	}
	if err := s.Send(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	r, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), fastReceiver)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := r.Receive(context.Background(), 100)
	if err != nil || len(ds) != 70 {
		t.Fatalf("Receive(100) = %d messages, %v; want all 70 in one call", len(ds), err)
	}
	for _, d := range ds {
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReceiveHonoursContext: a Receive polling an empty queue returns ctx's error at once
// when ctx ends, and nothing (no error) when WaitTime passes.
func TestReceiveHonoursContext(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	name := newQueue(t, client)
	r, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), &outboxazqueue.ReceiverConfig{WaitTime: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := r.Receive(context.Background(), 10)
	if err != nil || len(ds) != 0 {
		t.Fatalf("Receive on an empty queue = %d, %v; want none and no error after WaitTime", len(ds), err)
	}
	long, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), &outboxazqueue.ReceiverConfig{WaitTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := long.Receive(ctx, 10); done <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive after cancel = %v, want context.Canceled", err)
	}
}

// TestSendHonoursContext: a cancelled Send makes no request and fails the whole batch.
func TestSendHonoursContext(t *testing.T) {
	client := serviceClient(t)
	s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: "txo-unused"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Send(ctx, []outbox.Message{msg("a.b", `{}`)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Send with a cancelled ctx = %v, want context.Canceled", err)
	}
}

// TestOversizeCaughtBeforeSend: the limit is checked on the encoded text, and an oversize
// message never reaches the service (the queue here does not even exist).
func TestOversizeCaughtBeforeSend(t *testing.T) {
	client := serviceClient(t)
	for _, tc := range []struct {
		enc       outboxazqueue.Encoding
		fits, big int // payload sizes just under and just over the limit
	}{
		{outboxazqueue.Base64, 48 << 10, 49 << 10},
		{outboxazqueue.Text, 63 << 10, 64 << 10},
	} {
		s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: "txo-never-created", Encoding: tc.enc})
		if err != nil {
			t.Fatal(err)
		}
		big := msg("a.b", `"`+strings.Repeat("x", tc.big)+`"`)
		err = s.Send(context.Background(), []outbox.Message{big})
		var be *outbox.BatchError
		if !errors.As(err, &be) || !errors.Is(be.Failed[0], outbox.ErrTooLarge) {
			t.Fatalf("%v: Send of %d bytes = %v, want ErrTooLarge", tc.enc, tc.big, err)
		}
		want := fmt.Sprintf("message %s is ", big.ID)
		if text := be.Failed[0].Error(); !strings.Contains(text, want) || !strings.Contains(text, "after "+tc.enc.String()+" encoding, over the Azure Queue Storage limit of 64 KiB") {
			t.Errorf("%v: error %q should give the size after encoding and the limit", tc.enc, text)
		}
		if tc.enc == outboxazqueue.Text {
			continue
		}
		// Just under the limit fails only because the queue is missing: it was sent.
		err = s.Send(context.Background(), []outbox.Message{msg("a.b", `"`+strings.Repeat("x", tc.fits-400)+`"`)})
		if !errors.As(err, &be) || errors.Is(be.Failed[0], outbox.ErrTooLarge) {
			t.Fatalf("%v: a message under the limit: %v, want it sent (and failing on the missing queue)", tc.enc, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	client := serviceClient(t)
	_, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{
		DefaultQueue: "Orders_Queue",
		Routes:       map[string]string{"a.b": "ab", "c.d": "double--hyphen", "": "fine-name"},
		Concurrency:  -1,
		TimeToLive:   time.Millisecond,
		Encoding:     7,
	})
	if err == nil {
		t.Fatal("NewSender accepted an invalid config")
	}
	for _, want := range []string{`DefaultQueue: queue name "Orders_Queue" is invalid`, `Routes["a.b"]: queue name "ab"`, `Routes["c.d"]: queue name "double--hyphen"`, "empty event type", "Concurrency -1", "TimeToLive 1ms", "Encoding(7)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NewSender error lacks %q:\n%v", want, err)
		}
	}
	if _, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{}); err == nil || !strings.Contains(err.Error(), "neither DefaultQueue nor Routes") {
		t.Errorf("NewSender with no queue = %v", err)
	}
	if _, err := outboxazqueue.NewSender(nil, nil); err == nil || !strings.Contains(err.Error(), "needs an *azqueue.ServiceClient") {
		t.Errorf("NewSender(nil, nil) = %v", err)
	}
	_, err = outboxazqueue.NewReceiver(client.NewQueueClient("q-q"), &outboxazqueue.ReceiverConfig{
		VisibilityTimeout: 8 * 24 * time.Hour, MinPollInterval: time.Second, MaxPollInterval: time.Millisecond, WaitTime: -1, RequestTimeout: -1,
	})
	for _, want := range []string{"VisibilityTimeout 192h0m0s", "MinPollInterval (1s) <= MaxPollInterval (1ms)", "WaitTime -1ns", "RequestTimeout -1ns"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewReceiver error lacks %q: %v", want, err)
		}
	}
	if _, err := outboxazqueue.NewReceiver(client.NewQueueClient("q-q"), nil); err != nil {
		t.Errorf("NewReceiver with defaults: %v", err)
	}
}

func msg(typ, body string) outbox.Message {
	return outbox.Message{
		ID:          uuid.Must(uuid.NewV7()),
		Type:        typ,
		ContentType: "application/json",
		Body:        []byte(body),
		CreatedAt:   time.Now().UTC(),
	}
}

// requestLog records when each request a client makes starts.
type requestLog struct {
	mu    sync.Mutex
	times []time.Time
	c     *http.Client
}

func (t *requestLog) Do(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	t.times = append(t.times, time.Now())
	t.mu.Unlock()
	return t.c.Do(req)
}

// TestIdleBackoff: polling an empty queue backs off, doubling from MinPollInterval up to
// MaxPollInterval, instead of hammering the service (every request is billed).
//
// It asserts lower bounds only (a timer never fires early), so a slow machine cannot make
// it fail: each gap between requests is at least the scheduled wait, except the last one,
// which WaitTime may cut short.
func TestIdleBackoff(t *testing.T) {
	t.Parallel()
	client := serviceClient(t)
	name := newQueue(t, client)
	log := &requestLog{c: &http.Client{Transport: transport}}
	q, err := azqueue.NewQueueClientFromConnectionString(outboxtest.AzuriteConnString(), name, &azqueue.ClientOptions{
		ClientOptions: azcore.ClientOptions{Transport: log},
	})
	if err != nil {
		t.Fatal(err)
	}
	const minPoll, maxPoll = 10 * time.Millisecond, 100 * time.Millisecond
	r, err := outboxazqueue.NewReceiver(q, &outboxazqueue.ReceiverConfig{
		MinPollInterval: minPoll, MaxPollInterval: maxPoll, WaitTime: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ds, err := r.Receive(context.Background(), 1); err != nil || len(ds) != 0 {
		t.Fatalf("Receive = %d, %v; want none after WaitTime", len(ds), err)
	}
	log.mu.Lock()
	times := log.times
	log.mu.Unlock()
	// Waits of 10, 20, 40, 80, then 100ms: 14 requests at most (13 within the second, one
	// last look at its end); a fixed 10ms poll would make about 100.
	if len(times) < 2 || len(times) > 14 {
		t.Fatalf("%d requests in one second of idle polling, want 2..14", len(times))
	}
	want := minPoll
	for i := 1; i < len(times)-1; i++ {
		if gap := times[i].Sub(times[i-1]); gap < want {
			t.Errorf("gap %d between requests = %v, want at least %v", i, gap, want)
		}
		want = min(want*2, maxPoll)
	}
}
