// Package outboxkafka is the Apache Kafka transport of txoutbox, built on franz-go (kgo). It
// is for application developers whose broker is Kafka.
//
// # Sending
//
// A [Sender] is the relay's outbox.Sender. It produces each batch through a kgo.Client the
// caller configured, which must be an idempotent producer (franz-go's default: idempotent
// writes, acks from all in-sync replicas), and waits for every record's acknowledgement;
// per-record failures come back as an *outbox.BatchError. The event key is the record key,
// so franz-go's partitioner (murmur2, as Java's) puts a key's events in one partition, in
// the order the relay sent them; keyless events spread over the partitions. Each event
// type goes to its route's topic, or to the default topic ([SenderConfig]).
//
// A record is checked against the size limits before it is produced: the client's
// kgo.ProducerBatchMaxBytes, the topic's max.message.bytes (read once per topic with
// DescribeConfigs) and [SenderConfig].MaxMessageBytes. An oversize record fails with an
// error wrapping outbox.ErrTooLarge that names the limit, and the relay dead-letters it at
// once; a refusal by the broker itself (MESSAGE_TOO_LARGE) is reported the same way.
//
// # Key order
//
// [Sender.Send] keeps the order of a key's messages within a call: they are produced one
// at a time, the next once the broker acknowledged the one before (keys, and keyless
// messages, go side by side), and a message that fails, before it is produced (no route,
// too large) or at the broker, fails the rest of its key in the call unsent. franz-go alone
// would not keep that: after a failed batch it fails the records already buffered for the
// partition, but a record produced a moment later is written. The Sender does not declare
// outbox.KeyOrderer, so the relay still sends it one message of each key per call
// (waves): with a key's records waiting for each other's acknowledgement, a claim in one
// call drains no faster (measured against kfake), and it must fit in one SendTimeout, where
// waves past the lease are given back without an error; a hot key's run on a slow cluster
// would time out and pause the relay as if the broker were down.
//
// # Outages
//
// A produce that fails for reasons of the cluster or the connection is the broker's fault,
// not the record's: its errors are marked with outbox.Unavailable, so the relay pauses and
// probes until the cluster takes records again, spending no message's attempts. They are:
// brokers that cannot be reached or dropped the connection, every error Kafka calls
// retriable (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS,
// REQUEST_TIMED_OUT, THROTTLING_QUOTA_EXCEEDED, UNKNOWN_TOPIC_OR_PARTITION for a topic that
// does not exist yet, KAFKA_STORAGE_ERROR…), BROKER_NOT_AVAILABLE, authorization and SASL
// failures, a closed client, records franz-go gave up on (kgo.ErrRecordTimeout,
// kgo.ErrRecordRetries), and no acknowledgement before the send's deadline: franz-go
// retries a produce to a cluster that is gone until then. What the broker refuses in one
// record stays the record's: MESSAGE_TOO_LARGE (outbox.ErrTooLarge), CORRUPT_MESSAGE,
// INVALID_RECORD, INVALID_TIMESTAMP; and so does a small record refused with a batch that
// was too large (retried). A [Receiver]'s fetch errors are marked the same way.
// [Sender.Ping] (an [outbox.Pinger]) asks a broker for the cluster's brokers, producing
// nothing: a relay with nothing left to send learns so that the cluster is back.
//
// # Compression
//
// The Sender produces through the client you configured, so the client's compression
// applies. franz-go compresses batches with Snappy unless told otherwise, which Java,
// librdkafka and franz-go consumers read as they are, but kafkajs (Node.js) cannot read
// without a Snappy codec plugin (it decodes only gzip on its own). When consumers in other
// languages read the topics, pick the codec they all read when you create the client:
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
//		kgo.ProducerBatchCompression(kgo.GzipCompression())) // or kgo.NoCompression()
//
// # Wire format
//
// Records are CloudEvents 1.0 in the binary mode of the Kafka protocol binding: the value is
// the payload, the attributes are headers prefixed "ce_" (ce_id, ce_type, ce_source,
// ce_time, ce_specversion, ce_partitionkey, ce_traceparent…) and datacontenttype is the
// "content-type" header, so any CloudEvents SDK's Kafka binding reads them. The header
// [DedupIDHeader] carries outbox.Message.DedupID. Kafka does not deduplicate by it: a
// relay that crashed between producing and deleting its batch produces it again, and the
// consumer's inbox absorbs the copy.
//
// # Receiving
//
// A [Receiver] is a consumer-group member with manual commits. Kafka acknowledges
// positions, not messages, so the receiver tracks each record of each assigned partition:
// a record is settled by Ack, and the group's offset for a partition moves only past a
// contiguous run of settled records (a failed record is retried, never skipped). Commits
// are sent asynchronously as records settle, and synchronously when partitions are revoked
// and on Close; a commit lost in a crash means redelivery, which the inbox absorbs.
//
// Kafka has no per-message negative acknowledgement. Nack keeps the record in the receiver
// and hands it out again after the delay, with Attempt one higher. Meanwhile the later
// records of the same key in that partition wait behind it (per-key order holds through
// retries, as on an SQS FIFO queue), while other keys of the partition, and other
// partitions, go on. The alternatives were weighed: pausing the whole partition and
// seeking back blocks every key that hashes there for the delay, and a retry topic
// breaks per-key order and needs topics the application must provision. The cost of this
// design: the partition's committed offset stays at the oldest unsettled record while it
// waits, so a restart redelivers the records handled after it (the inbox absorbs them), and
// the records held back are bounded by [ReceiverConfig].MaxPendingPerPartition, at which
// the partition stops fetching until records settle. Once the consumer runtime's
// MaxAttempts is reached, it dead-letters the record and acks it, and the key flows again.
//
// Attempt counts the deliveries of a record by this Receiver, including through a
// revocation and reassignment to the same Receiver. Kafka keeps no delivery count, so
// after a restart, or when a rebalance moves the partition to another member, a record
// being retried starts again at attempt 1: a poison record then gets up to MaxAttempts
// tries per owner before it is dead-lettered.
//
// A receiver holds at most [ReceiverConfig].MaxHeldBytes (64 MiB by default) of records
// not yet acknowledged, plus one Receive's: it polls franz-go only below it, keeps its own
// copy of each record (a held record does not pin its whole fetch) and drops an
// acknowledged record's content at once. franz-go's fetch buffer comes on top; NewReceiver
// bounds it (kgo.FetchMaxBytes, kgo.MaxConcurrentFetches) unless its options do.
//
// On a rebalance, revoked partitions stop handing out records; the receiver waits up to
// [ReceiverConfig].RevokeTimeout for the records being handled, commits what was settled
// and lets the partitions go. Their new owner resumes from that commit.
package outboxkafka
