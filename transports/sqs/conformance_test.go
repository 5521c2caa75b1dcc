package outboxsqs_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

func TestConformance(t *testing.T) {
	for name, fifo := range map[string]bool{"standard": false, "fifo": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseTransport(t, func(t *testing.T) *outboxtest.TransportFixture {
				c := requireSQS(t)
				url := newQueue(t, c, fifo)
				s, err := outboxsqs.NewSender(c, &outboxsqs.SenderConfig{QueueURL: url})
				if err != nil {
					t.Fatal(err)
				}
				r, err := outboxsqs.NewReceiver(c, &outboxsqs.ReceiverConfig{QueueURL: url, WaitTime: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				// send puts a message on the queue as a producer using the SQS SDK alone does:
				// on a FIFO queue in the group of its partitionkey, with its own dedup ID.
				send := func(ctx context.Context, attrs map[string]string, body []byte) error {
					in := &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String(string(body))}
					for k, v := range attrs {
						if in.MessageAttributes == nil {
							in.MessageAttributes = map[string]types.MessageAttributeValue{}
						}
						in.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
					}
					if fifo {
						in.MessageGroupId, in.MessageDeduplicationId = aws.String("foreign"), aws.String(uuid.NewString())
					}
					_, err := c.SendMessage(ctx, in)
					return err
				}
				return &outboxtest.TransportFixture{
					Outage:   func(t *testing.T) *outboxtest.OutageFixture { return sqsOutage(t, fifo) },
					Sender:   s,
					Receiver: r,
					Features: features(fifo),
					SendRaw: func(ctx context.Context, body []byte) error {
						return send(ctx, nil, body)
					},
					SendForeign: func(ctx context.Context, m outboxtest.ForeignMessage) error {
						return send(ctx, m.Headers, m.Body)
					},
					ReceiveForeign: func(ctx context.Context) (outboxtest.ForeignMessage, error) {
						return receiveForeign(ctx, c, url)
					},
				}
			})
		})
	}
}

// receiveForeign takes the next message off the queue with the SQS SDK alone, and deletes it.
func receiveForeign(ctx context.Context, c *sqs.Client, url string) (outboxtest.ForeignMessage, error) {
	for {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: &url, MaxNumberOfMessages: 1, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"},
		})
		if err != nil {
			return outboxtest.ForeignMessage{}, err
		}
		if len(out.Messages) == 0 {
			if err := ctx.Err(); err != nil {
				return outboxtest.ForeignMessage{}, err
			}
			continue
		}
		msg := out.Messages[0]
		if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: msg.ReceiptHandle}); err != nil {
			return outboxtest.ForeignMessage{}, err
		}
		m := outboxtest.ForeignMessage{Headers: map[string]string{}, Body: []byte(aws.ToString(msg.Body))}
		for k, v := range msg.MessageAttributes {
			if v.StringValue == nil {
				return outboxtest.ForeignMessage{}, errors.New("attribute " + k + " is not a String")
			}
			m.Headers[k] = *v.StringValue
		}
		return m, nil
	}
}

// sqsOutage is a queue on a private fauxqs, which the suite kills and starts again on the
// same port; the emulator keeps nothing, so Start creates the queue again, as the
// infrastructure would after losing it (in between, a Send meets a queue that does not
// exist).
func sqsOutage(t *testing.T, fifo bool) *outboxtest.OutageFixture {
	fauxqs := outboxtest.StartNodeProcess(t, "fauxqs", "fauxqs", func(dir string, port int) ([]string, []string) {
		return []string{"fauxqs.mjs"}, []string{"FAUXQS_PORT=" + strconv.Itoa(port)}
	})
	c := newClientAt("http://127.0.0.1:" + strconv.Itoa(fauxqs.Port))
	name := "txo-" + uniqueName(t, 70)
	attrs := map[string]string{}
	if fifo {
		name += ".fifo"
		attrs[string(types.QueueAttributeNameFifoQueue)] = "true"
	}
	create := func(t testing.TB) string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
		if err != nil {
			t.Fatalf("creating queue %s: %v", name, err)
		}
		return *out.QueueUrl
	}
	url := create(t)
	s, r := newSender(t, c, &outboxsqs.SenderConfig{QueueURL: url}), newReceiver(t, c, url)
	return &outboxtest.OutageFixture{
		Sender:   s,
		Receiver: r,
		Features: features(fifo),
		Stop:     func(testing.TB) { fauxqs.Kill() },
		Start: func(t testing.TB) {
			fauxqs.Start()
			if got := create(t); got != url {
				t.Fatalf("the queue came back as %s, was %s", got, url)
			}
		},
		Pipeline: func(t *testing.T) *outboxtest.PipelineFixture {
			return pgxtest.New(t, "outboxsqs").Pipeline(t, s, r)
		},
	}
}

// features are what an SQS queue promises: per-group order and deduplication by ID on a FIFO
// queue, batches and delayed redelivery on any, and the Sender's default MaxMessageBytes.
func features(fifo bool) outboxtest.Features {
	return outboxtest.Features{FIFO: fifo, Dedup: fifo, Batch: true, Delay: true, MaxMessageBytes: outboxsqs.DefaultMaxMessageBytes}
}
