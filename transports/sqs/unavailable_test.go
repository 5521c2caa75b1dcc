package outboxsqs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/txoutbox/outbox"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// scriptedSQS answers SendMessageBatch with err, or fails each entry with failure.
type scriptedSQS struct {
	err     error
	failure *types.BatchResultErrorEntry
}

func (s scriptedSQS) SendMessageBatch(_ context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	if s.err != nil {
		return nil, s.err
	}
	out := &sqs.SendMessageBatchOutput{}
	for _, e := range in.Entries {
		f := *s.failure
		f.Id = e.Id
		out.Failed = append(out.Failed, f)
	}
	return out, nil
}

func (s scriptedSQS) GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) {
	if s.err != nil {
		return nil, s.err
	}
	return &sqs.GetQueueAttributesOutput{}, nil
}

// TestBrokerFaultClassification: a SendMessageBatch that fails for reasons of SQS, the
// endpoint or the connection — whole, or entry by entry — fails every message as
// outbox.Unavailable; what SQS refuses in one message is not. A Ping that fails with the
// same error is classified the same.
func TestBrokerFaultClassification(t *testing.T) {
	status := func(code int, api error) error {
		return &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}}, Err: api}}
	}
	apiErr := func(code string, fault smithy.ErrorFault) error {
		return &smithy.GenericAPIError{Code: code, Message: code, Fault: fault}
	}
	entry := func(code string, senderFault bool) *types.BatchResultErrorEntry {
		return &types.BatchResultErrorEntry{Code: aws.String(code), Message: aws.String(code), SenderFault: senderFault}
	}
	for _, c := range []struct {
		name    string
		sqs     scriptedSQS
		broker  bool
		permErr bool
	}{
		{name: "refused", sqs: scriptedSQS{err: &smithyhttp.RequestSendError{Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}}, broker: true},
		{name: "retry quota", sqs: scriptedSQS{err: errors.Join(errors.New("dial"), fmt.Errorf("failed to get rate limit token, %w", ratelimit.QuotaExceededError{}))}, broker: true},
		{name: "throttled", sqs: scriptedSQS{err: status(400, apiErr("RequestThrottled", smithy.FaultClient))}, broker: true},
		{name: "missing queue", sqs: scriptedSQS{err: status(400, &types.QueueDoesNotExist{ErrorCodeOverride: aws.String("AWS.SimpleQueueService.NonExistentQueue")})}, broker: true},
		{name: "KMS throttled", sqs: scriptedSQS{err: status(400, &types.KmsThrottled{})}, broker: true},
		{name: "access denied", sqs: scriptedSQS{err: status(403, apiErr("AccessDenied", smithy.FaultClient))}, broker: true},
		{name: "bad signature", sqs: scriptedSQS{err: status(403, apiErr("SignatureDoesNotMatch", smithy.FaultClient))}, broker: true},
		{name: "503", sqs: scriptedSQS{err: status(503, apiErr("ServiceUnavailable", smithy.FaultServer))}, broker: true},
		{name: "500 without a code", sqs: scriptedSQS{err: status(500, errors.New("internal"))}, broker: true},
		{name: "deadline", sqs: scriptedSQS{err: context.DeadlineExceeded}, broker: true},
		{name: "entry: internal error", sqs: scriptedSQS{failure: entry("InternalError", false)}, broker: true},
		{name: "entry: KMS throttled", sqs: scriptedSQS{failure: entry("KmsThrottled", true)}, broker: true},
		{name: "invalid parameter", sqs: scriptedSQS{err: status(400, apiErr("InvalidParameterValue", smithy.FaultClient))}},
		{name: "entry: invalid contents", sqs: scriptedSQS{failure: entry("InvalidMessageContents", true)}, permErr: true},
		{name: "entry: unknown sender fault", sqs: scriptedSQS{failure: entry("SomethingNew", true)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := outboxsqs.NewSender(c.sqs, &outboxsqs.SenderConfig{QueueURL: "https://sqs.us-east-1.amazonaws.com/123456789012/orders"})
			if err != nil {
				t.Fatal(err)
			}
			if c.sqs.err != nil { // a Ping meets the same errors: classified alike
				if err := s.Ping(context.Background()); outbox.IsUnavailable(err) != c.broker {
					t.Errorf("Ping: %v: unavailable %v, want %v", err, outbox.IsUnavailable(err), c.broker)
				}
			}
			msgs := []outbox.Message{message("t", "", `{}`), message("t", "", `{}`)}
			err = s.Send(context.Background(), msgs)
			var be *outbox.BatchError
			errs := []error{err}
			if errors.As(err, &be) {
				errs = []error{be.Failed[0], be.Failed[1]}
			}
			for i, e := range errs {
				if e == nil {
					t.Fatalf("message %d did not fail", i)
				}
				if got := outbox.IsUnavailable(e); got != c.broker {
					t.Errorf("message %d: %v: unavailable %v, want %v", i, e, got, c.broker)
				}
				if got := outbox.IsPermanent(e); got != c.permErr {
					t.Errorf("message %d: %v: permanent %v, want %v", i, e, got, c.permErr)
				}
			}
		})
	}
}
