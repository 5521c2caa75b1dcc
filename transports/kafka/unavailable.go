package outboxkafka

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/brokerfault"
)

// recordErrs are the broker's refusals of one record: its size, its checksum or format, its
// timestamp. CORRUPT_MESSAGE is retriable for Kafka (a record garbled on the way), but a
// record that is corrupt itself would pause the relay for good if it were the broker's
// fault, so it counts against the record.
var recordErrs = []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.CorruptMessage,
	kerr.InvalidRecord, kerr.InvalidTimestamp}

// brokerKerrs are the Kafka errors that are not retriable for Kafka but are the cluster's
// or the credentials' state all the same: the relay waits for them to be fixed.
var brokerKerrs = []error{kerr.BrokerNotAvailable, kerr.TopicAuthorizationFailed,
	kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed, kerr.IllegalSaslState,
	kerr.UnsupportedSaslMechanism, kerr.DelegationTokenAuthorizationFailed}

// clientErrs are franz-go's errors for records it could not produce in time or at all.
var clientErrs = []error{kgo.ErrClientClosed, kgo.ErrRecordTimeout, kgo.ErrRecordRetries,
	kgo.ErrAborting, kgo.ErrMaxBuffered, context.DeadlineExceeded}

// isBrokerFault reports whether err failed a produce or a fetch for reasons of the cluster
// or the connection: a broker that cannot be reached or dropped the connection, a
// retriable Kafka error (no leader or not the leader, not enough replicas, request timed
// out, throttled, a topic that does not exist yet, a storage error), authorization or SASL
// failures, a closed client, or no acknowledgement in time. What the broker refuses in
// one record (too large, corrupt, invalid, a bad timestamp) is the record's.
func isBrokerFault(err error) bool {
	if err == nil {
		return false
	}
	if brokerfault.IsAny(err, recordErrs...) {
		return false
	}
	var firstRead *kgo.ErrFirstReadEOF // the connection closed at once: TLS or SASL mismatch
	return kerr.IsRetriable(err) || kgo.IsRetryableBrokerErr(err) || errors.As(err, &firstRead) ||
		brokerfault.IsAny(err, brokerKerrs...) || brokerfault.IsAny(err, clientErrs...) || outbox.IsUnavailable(err)
}

// markBrokerFault returns err marked with outbox.Unavailable when it is the broker's fault
// (isBrokerFault), else err as it is: a permanent error stays permanent.
func markBrokerFault(err error) error { return brokerfault.Mark(err, isBrokerFault) }
