package outboxsqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

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
				return &outboxtest.TransportFixture{
					Sender:   s,
					Receiver: r,
					Features: s.Features(),
					SendRaw: func(ctx context.Context, body []byte) error {
						in := &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String(string(body))}
						if fifo {
							in.MessageGroupId, in.MessageDeduplicationId = aws.String("raw"), aws.String("raw")
						}
						_, err := c.SendMessage(ctx, in)
						return err
					},
				}
			})
		})
	}
}
