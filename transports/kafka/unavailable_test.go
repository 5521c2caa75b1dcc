package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
)

// TestBrokerFaultClassification: the cluster's and the connection's errors are marked
// outbox.Unavailable; what the broker refuses in one record is not.
func TestBrokerFaultClassification(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		broker bool
	}{
		{"not leader", kerr.NotLeaderForPartition, true},
		{"leader not available", kerr.LeaderNotAvailable, true},
		{"request timed out", kerr.RequestTimedOut, true},
		{"not enough replicas", kerr.NotEnoughReplicas, true},
		{"unknown topic", kerr.UnknownTopicOrPartition, true},
		{"throttled", kerr.ThrottlingQuotaExceeded, true},
		{"broker not available", kerr.BrokerNotAvailable, true},
		{"topic authorization", kerr.TopicAuthorizationFailed, true},
		{"SASL", kerr.SaslAuthenticationFailed, true},
		{"client closed", kgo.ErrClientClosed, true},
		{"record timeout", kgo.ErrRecordTimeout, true},
		{"connection dropped", io.EOF, true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"no ack in time", context.DeadlineExceeded, true},
		{"too large", kerr.MessageTooLarge, false},
		{"batch too large", kerr.RecordListTooLarge, false},
		{"corrupt", kerr.CorruptMessage, false},
		{"invalid record", kerr.InvalidRecord, false},
		{"invalid timestamp", kerr.InvalidTimestamp, false},
		{"cancelled by the caller", context.Canceled, false},
		{"permanent", outbox.Permanent(kerr.NotLeaderForPartition), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := markBrokerFault(fmt.Errorf("outboxkafka: producing: %w", c.err)); errors.Is(err, outbox.ErrUnavailable) != c.broker {
				t.Errorf("%v: marked unavailable %v, want %v", err, !c.broker, c.broker)
			}
		})
	}
}
