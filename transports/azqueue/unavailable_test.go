package outboxazqueue

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2/queueerror"

	"github.com/txoutbox/outbox"
)

// TestBrokerFaultClassification: the service's, the account's and the connection's errors
// are marked outbox.Unavailable; what the service refuses in one message is not.
func TestBrokerFaultClassification(t *testing.T) {
	answer := func(status int, code queueerror.Code) error {
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:10001/devstoreaccount1/orders/messages", nil)
		resp := &http.Response{StatusCode: status, Status: http.StatusText(status), Header: http.Header{}, Request: req, Body: http.NoBody}
		if code != "" {
			resp.Header.Set("x-ms-error-code", string(code))
		}
		return runtime.NewResponseError(resp)
	}
	for _, c := range []struct {
		name   string
		err    error
		broker bool
	}{
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"no answer in time", context.DeadlineExceeded, true},
		{"queue not found", answer(404, queueerror.QueueNotFound), true},
		{"queue being deleted", answer(409, queueerror.QueueBeingDeleted), true},
		{"server busy", answer(503, queueerror.ServerBusy), true},
		{"internal error", answer(500, queueerror.InternalError), true},
		{"throttled", answer(429, ""), true},
		{"authentication", answer(403, queueerror.AuthenticationFailed), true},
		{"authorization", answer(403, queueerror.AuthorizationPermissionMismatch), true},
		{"account disabled", answer(403, queueerror.AccountIsDisabled), true},
		{"too large", answer(413, queueerror.RequestBodyTooLarge), false},
		{"message too large", answer(400, queueerror.MessageTooLarge), false},
		{"invalid XML", answer(400, queueerror.InvalidXMLDocument), false},
		{"other 400", answer(400, queueerror.InvalidQueryParameterValue), false},
		{"cancelled by the caller", context.Canceled, false},
		{"permanent", outbox.Permanent(answer(503, queueerror.ServerBusy)), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := markBrokerFault(fmt.Errorf("outboxazqueue: sending: %w", c.err)); errors.Is(err, outbox.ErrUnavailable) != c.broker {
				t.Errorf("%v: marked unavailable %v, want %v", err, !c.broker, c.broker)
			}
		})
	}
}
