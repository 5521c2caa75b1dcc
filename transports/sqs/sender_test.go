package outboxsqs_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
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

func newSender(t testing.TB, c *sqs.Client, cfg *outboxsqs.SenderConfig) *outboxsqs.Sender {
	t.Helper()
	s, err := outboxsqs.NewSender(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newReceiver(t testing.TB, c *sqs.Client, url string) *outboxsqs.Receiver {
	t.Helper()
	r, err := outboxsqs.NewReceiver(c, &outboxsqs.ReceiverConfig{QueueURL: url, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// receiveIDs receives n messages, acks them and returns their event IDs.
func receiveIDs(t testing.TB, r outbox.Receiver, n int) map[uuid.UUID]int {
	t.Helper()
	ids := map[uuid.UUID]int{}
	for _, d := range outboxtest.ReceiveN(t, r, n, 10*time.Second) {
		m, err := d.Message()
		if err != nil {
			t.Fatal(err)
		}
		ids[m.ID]++
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// The Sender counts a message's size as SQS does: a message of exactly the queue's
// MaximumMessageSize is accepted, one byte more is refused by the broker, and by the Sender
// before sending when its limit is the same.
func TestSizeCountedAsSQSCountsIt(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	const limit = 2048
	url := newQueue(t, c, false)
	_, err := c.SetQueueAttributes(context.Background(), &sqs.SetQueueAttributesInput{
		QueueUrl: &url, Attributes: map[string]string{"MaximumMessageSize": strconv.Itoa(limit)},
	})
	if err != nil {
		t.Fatal(err)
	}
	sized := func(size int) outbox.Message {
		m := message("size.test", "k", "")
		m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
		m.Body = []byte(`"` + strings.Repeat("x", size) + `"`)
		n, err := outboxsqs.EncodedSize(m, "")
		if err != nil {
			t.Fatal(err)
		}
		m.Body = []byte(`"` + strings.Repeat("x", size-(n-size)) + `"`)
		if n, _ := outboxsqs.EncodedSize(m, ""); n != size {
			t.Fatalf("built a message of %d bytes, want %d", n, size)
		}
		return m
	}
	loose := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url, MaxMessageBytes: outboxsqs.MaxMessageBytesLimit})
	exact, over := sized(limit), sized(limit+1)
	if err := loose.Send(context.Background(), []outbox.Message{exact}); err != nil {
		t.Fatalf("a message of exactly %d bytes: %v", limit, err)
	}
	small := message("size.test", "", `{}`)
	err = loose.Send(context.Background(), []outbox.Message{small, over})
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || !errors.Is(be.Failed[1], outbox.ErrTooLarge) {
		t.Fatalf("SQS's own refusal of %d bytes: Send = %v, want a BatchError failing message 1 with ErrTooLarge", limit+1, err)
	}
	t.Log("refused by the broker: ", be.Failed[1])

	strict := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url, MaxMessageBytes: limit})
	err = strict.Send(context.Background(), []outbox.Message{over})
	if !errors.As(err, &be) || !errors.Is(be.Failed[0], outbox.ErrTooLarge) || !strings.Contains(be.Failed[0].Error(), "over the SQS limit of 2 KiB") {
		t.Fatalf("Send of %d bytes with MaxMessageBytes %d = %v, want ErrTooLarge naming the limit", limit+1, limit, err)
	}
	t.Log("refused before sending: ", be.Failed[0])
	got := receiveIDs(t, newReceiver(t, c, url), 2)
	if got[exact.ID] != 1 || got[small.ID] != 1 {
		t.Fatalf("received %v, want %s and %s", got, exact.ID, small.ID)
	}
}

func TestSendRoutesByEventType(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	audit, orders := newQueue(t, c, false), newQueue(t, c, true)
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: orders, Routes: map[string]string{"audit.logged": audit}})
	var msgs []outbox.Message
	want := map[string]map[uuid.UUID]int{audit: {}, orders: {}}
	for i := range 23 {
		m := message("orders.completed", fmt.Sprint("order-", i), `{}`)
		q := orders
		if i%3 == 0 {
			m.Type, q = "audit.logged", audit
		}
		msgs = append(msgs, m)
		want[q][m.ID] = 1
	}
	if err := s.Send(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	for q, ids := range want {
		if got := receiveIDs(t, newReceiver(t, c, q), len(ids)); fmt.Sprint(got) != fmt.Sprint(ids) {
			t.Errorf("queue %s received %v, want %v", q, got, ids)
		}
		outboxtest.ExpectNone(t, newReceiver(t, c, q), 300*time.Millisecond)
	}

	strict := newSender(t, c, &outboxsqs.SenderConfig{Routes: map[string]string{"audit.logged": audit}})
	err := strict.Send(context.Background(), []outbox.Message{message("orders.completed", "", `{}`)})
	var be *outbox.BatchError
	if !errors.As(err, &be) || !outbox.IsPermanent(be.Failed[0]) || !strings.Contains(err.Error(), `"orders.completed", which has no route`) {
		t.Fatalf("unrouted event: Send = %v, want a permanent error naming its type", err)
	}
}

// A large Send is split into calls of 10, several in flight at once; every message arrives
// once.
func TestSendManyConcurrently(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	url := newQueue(t, c, false)
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url, MaxConcurrentCalls: 3})
	var msgs []outbox.Message
	for i := range 95 {
		msgs = append(msgs, message("bulk", "", fmt.Sprintf(`{"n":%d}`, i)))
	}
	if err := s.Send(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	got := receiveIDs(t, newReceiver(t, c, url), len(msgs))
	for _, m := range msgs {
		if got[m.ID] != 1 {
			t.Fatalf("message %s received %d times", m.ID, got[m.ID])
		}
	}
}

func TestSendHonoursContext(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	url := newQueue(t, c, false)
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var msgs []outbox.Message
	for range 25 {
		msgs = append(msgs, message("t", "", `{}`))
	}
	if err := s.Send(ctx, msgs); !errors.Is(err, context.Canceled) || outbox.IsPermanent(err) {
		t.Fatalf("Send with a cancelled context = %v, want context.Canceled", err)
	}
	if err := s.Send(ctx, msgs[:1]); !errors.Is(err, context.Canceled) {
		t.Fatalf("Send of one message with a cancelled context = %v, want context.Canceled", err)
	}
	outboxtest.ExpectNone(t, newReceiver(t, c, url), 500*time.Millisecond)
}

// A missing queue fails the whole batch with an error that names the queue, marked as the
// broker's fault (outbox.Unavailable): the relay waits for the queue, spending no attempt.
func TestSendToMissingQueue(t *testing.T) {
	t.Parallel()
	c := requireSQS(t)
	url := outboxtest.SQSEndpoint() + "/000000000000/txo-does-not-exist-" + uuid.NewString()[:8]
	s := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url})
	err := s.Send(context.Background(), []outbox.Message{message("t", "", `{}`), message("t", "", `{}`)})
	var be *outbox.BatchError
	if err == nil || errors.As(err, &be) || !outbox.IsUnavailable(err) || !strings.Contains(err.Error(), "txo-does-not-exist") {
		t.Fatalf("Send to a missing queue = %v, want one error marked unavailable naming the queue", err)
	}
	t.Log(err)
}

var _ = aws.String
