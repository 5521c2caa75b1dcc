package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txoutbox/outbox"
)

// ErrClosed is returned by a [Receiver] used after Close.
var ErrClosed = errors.New("outboxkafka: receiver closed")

// maxCarried bounds the attempt counts kept for records of partitions this receiver lost.
const maxCarried = 10_000

// Receiver reads records of a consumer group and hands them out as deliveries; it
// implements outbox.Receiver and is safe for concurrent use (Receive calls take turns).
// See the package documentation for how it commits, retries and rebalances.
type Receiver struct {
	cl  *kgo.Client
	cfg *ReceiverConfig

	recv sync.Mutex // one Receive polls at a time

	mu         sync.Mutex
	parts      map[topicPartition]*partition
	order      []topicPartition // round-robin order of parts, for fairness between partitions
	next       int              // where the next take starts in order
	changed    chan struct{}    // closed (and replaced) when a record may have become ready
	carried    map[recordID]int // attempts of unsettled records whose partition was revoked
	committing bool             // an async commit is in flight
	closed     bool
	blocked    map[string]bool // scratch for take: keys with an earlier unsettled record
	heldBytes  int             // sizes of the unsettled records of parts
}

type topicPartition struct {
	topic     string
	partition int32
}

type recordID struct {
	topicPartition
	offset int64
}

// partition is what the receiver holds of one assigned partition.
type partition struct {
	topicPartition
	recs        []*record // from the oldest unsettled record, in offset order
	outstanding int       // records handed out and not settled
	paused      bool      // fetching stopped: MaxPendingPerPartition records held
	revoked     bool      // being revoked: hand nothing out
	done        kgo.EpochOffset
	committed   int64 // offset of the last commit sent, -1 before any
}

type recordState uint8

const (
	stateReady   recordState = iota // fetched, not handed out yet
	stateOut                        // handed out, waiting for Ack or Nack
	stateWaiting                    // nacked, handed out again at due
	stateSettled                    // acked
)

// record is one fetched record and its progress through the receiver.
type record struct {
	rec     *kgo.Record
	msg     outbox.Message
	err     error
	state   recordState
	due     time.Time
	attempt int // deliveries so far
	size    int // as Kafka counts it (recordSize), in heldBytes until settled
	part    *partition
}

// NewReceiver creates a franz-go client that joins cfg.Group to consume cfg.Topics, and a
// receiver reading through it. opts configure the client's connection (kgo.SeedBrokers,
// TLS, SASL…) and may tune the group (kgo.SessionTimeout, kgo.Balancers,
// kgo.ConsumeResetOffset…); the receiver sets the group, the topics, manual commits and
// its rebalance callbacks itself, after opts. It validates cfg and reports every problem at
// once. Close the receiver when done: it commits what was handled and leaves the group.
//
// A new group starts at the earliest offset (franz-go's default), so events produced
// before the group first joined are consumed too.
func NewReceiver(cfg *ReceiverConfig, opts ...kgo.Opt) (*Receiver, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	r := &Receiver{
		cfg:     c,
		parts:   map[topicPartition]*partition{},
		changed: make(chan struct{}),
		carried: map[recordID]int{},
		blocked: map[string]bool{},
	}
	// franz-go's own buffer of fetched records, unless opts size it: later options win.
	fetch := int32(min(max(c.MaxHeldBytes/4, 1<<20), 1<<30))
	all := append([]kgo.Opt{kgo.FetchMaxBytes(fetch), kgo.MaxConcurrentFetches(2), kgo.BrokerMaxReadBytes(max(fetch*2, 100<<20))}, opts...)
	all = append(all,
		kgo.ConsumerGroup(c.Group),
		kgo.ConsumeTopics(c.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(r.onAssigned),
		kgo.OnPartitionsRevoked(r.onRevoked),
		kgo.OnPartitionsLost(r.onLost),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: NewReceiver: %w", err)
	}
	r.cl = cl
	return r, nil
}

// Client returns the receiver's franz-go client, for metrics and admin requests. Do not
// poll, commit or close through it.
func (r *Receiver) Client() *kgo.Client { return r.cl }

// Receive returns up to limit deliveries: at once those ready, otherwise the first to arrive
// within MaxWait (with any that arrived along with it), or none when MaxWait passes. A
// record is ready when it was fetched and no earlier record of its key in its partition is
// unsettled, or when its retry delay has passed. Once ctx is done it returns ctx's error;
// records fetched meanwhile stay with the receiver for the next call.
func (r *Receiver) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.recv.Lock()
	defer r.recv.Unlock()
	limit = max(limit, 1)
	deadline := time.Now().Add(r.cfg.MaxWait)
	for {
		r.commitAsync()
		out, due, wake, err := r.take(limit)
		if err != nil || len(out) > 0 {
			return out, err
		}
		if !time.Now().Before(deadline) {
			return nil, nil
		}
		until := deadline
		if !due.IsZero() && due.Before(until) {
			until = due
		}
		if r.full() { // fetch nothing more until records settle
			t := time.NewTimer(time.Until(until))
			select {
			case <-wake:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			t.Stop()
			continue
		}
		pctx, cancel := context.WithDeadline(ctx, until)
		go func() { // a settled record may unblock its key: stop polling and look
			select {
			case <-wake:
				cancel()
			case <-pctx.Done():
			}
		}()
		fetches := r.cl.PollRecords(pctx, limit)
		cancel()
		err = r.ingest(fetches)
		r.cl.AllowRebalance()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			return nil, markBrokerFault(err)
		}
	}
}

// take hands out up to limit ready records, visiting partitions round-robin. With none
// ready it returns the earliest retry due time and the channel that signals a change.
func (r *Receiver) take(limit int) (out []outbox.Delivery, due time.Time, wake <-chan struct{}, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, time.Time{}, nil, ErrClosed
	}
	now := time.Now()
	n := len(r.order)
	for k := 0; k < n && len(out) < limit; k++ {
		p := r.parts[r.order[(r.next+k)%n]]
		if p.revoked {
			continue
		}
		clear(r.blocked)
		for _, rc := range p.recs {
			if len(out) == limit {
				break
			}
			if rc.state == stateSettled {
				continue
			}
			keyed := len(rc.rec.Key) > 0
			if keyed && r.blocked[string(rc.rec.Key)] {
				continue
			}
			switch {
			case rc.state == stateReady, rc.state == stateWaiting && !now.Before(rc.due):
				rc.state = stateOut
				rc.attempt++
				p.outstanding++
				out = append(out, &delivery{r: r, rc: rc, attempt: rc.attempt})
			case rc.state == stateWaiting && (due.IsZero() || rc.due.Before(due)):
				due = rc.due
			}
			if keyed { // later records of this key wait for this one
				r.blocked[string(rc.rec.Key)] = true
			}
		}
	}
	if n > 0 {
		r.next = (r.next + 1) % n
	}
	return out, due, r.changed, nil
}

// ingest adds fetched records to their partitions and pauses partitions at their cap. It
// returns the fetch errors worth reporting.
func (r *Receiver) ingest(fetches kgo.Fetches) error {
	var errs []error
	pause := map[string][]int32{}
	r.mu.Lock()
	fetches.EachError(func(topic string, part int32, err error) {
		switch {
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		case errors.Is(err, kgo.ErrClientClosed):
			errs = append(errs, ErrClosed)
		default:
			errs = append(errs, fmt.Errorf("outboxkafka: fetching %s/%d: %w", topic, part, err))
		}
	})
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		p := r.parts[topicPartition{fp.Topic, fp.Partition}]
		if p == nil || p.revoked {
			return // cannot happen with BlockRebalanceOnPoll; never hand out a lost partition's record
		}
		for _, rec := range fp.Records {
			rc := &record{rec: own(rec), part: p}
			rc.size = recordSize(rc.rec)
			r.heldBytes += rc.size
			rc.msg, rc.err = decode(rc.rec)
			id := recordID{p.topicPartition, rec.Offset}
			if a, ok := r.carried[id]; ok {
				rc.attempt = a
				delete(r.carried, id)
			}
			p.recs = append(p.recs, rc)
		}
		if !p.paused && len(p.recs) >= r.cfg.MaxPendingPerPartition {
			p.paused = true
			pause[p.topic] = append(pause[p.topic], p.partition)
		}
	})
	r.mu.Unlock()
	if len(pause) > 0 {
		r.cl.PauseFetchPartitions(pause)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// settle records the outcome of a handed-out record: acked, or to be retried after delay.
func (r *Receiver) settle(d *delivery, ack bool, delay time.Duration) error {
	r.mu.Lock()
	rc, p := d.rc, d.rc.part
	if rc.state != stateOut || rc.attempt != d.attempt {
		r.mu.Unlock()
		return fmt.Errorf("outboxkafka: %s was already acknowledged or negatively acknowledged", d.describe())
	}
	if r.parts[p.topicPartition] != p {
		r.mu.Unlock()
		return fmt.Errorf("outboxkafka: %s: partition %s/%d was revoked before it was settled; its new owner delivers it again", d.describe(), p.topic, p.partition)
	}
	p.outstanding--
	var resume map[string][]int32
	if ack {
		rc.state = stateSettled
		r.release(rc)
		i := 0
		for ; i < len(p.recs) && p.recs[i].state == stateSettled; i++ {
			p.done = kgo.EpochOffset{Epoch: p.recs[i].rec.LeaderEpoch, Offset: p.recs[i].rec.Offset + 1}
		}
		clear(p.recs[:i]) // let the trimmed records go
		p.recs = p.recs[i:]
		if p.paused && len(p.recs) <= r.cfg.MaxPendingPerPartition/2 {
			p.paused = false
			resume = map[string][]int32{p.topic: {p.partition}}
		}
	} else {
		rc.state = stateWaiting
		rc.due = time.Now().Add(delay)
	}
	r.signalLocked()
	r.mu.Unlock()
	if resume != nil {
		r.cl.ResumeFetchPartitions(resume)
	}
	return nil
}

// full reports whether the records held reach MaxHeldBytes.
func (r *Receiver) full() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.heldBytes >= r.cfg.MaxHeldBytes
}

// release stops counting rc, settled or dropped, and lets its content go: a settled
// record stays in its partition only for its offset while an earlier one is unsettled.
func (r *Receiver) release(rc *record) {
	r.heldBytes -= rc.size
	rc.size = 0
	rc.rec = &kgo.Record{Topic: rc.rec.Topic, Partition: rc.rec.Partition, Offset: rc.rec.Offset, LeaderEpoch: rc.rec.LeaderEpoch}
	rc.msg = outbox.Message{ID: rc.msg.ID}
	if rc.err != nil {
		rc.err = errReleased
	}
}

// errReleased is what a malformed record's delivery reports once acknowledged: its
// content is gone.
var errReleased = fmt.Errorf("outboxkafka: the record was acknowledged and its content released: %w", outbox.ErrMalformed)

// own returns a copy of rec whose key, value and header values are its own, in one
// allocation: franz-go's are slices of the whole fetch, which one record held would keep.
func own(rec *kgo.Record) *kgo.Record {
	c := *rec
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Value)
	}
	buf := make([]byte, 0, n)
	take := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		buf = append(buf, b...)
		return buf[len(buf)-len(b) : len(buf) : len(buf)]
	}
	c.Key, c.Value = take(rec.Key), take(rec.Value)
	if rec.Headers != nil {
		c.Headers = make([]kgo.RecordHeader, len(rec.Headers))
		for i, h := range rec.Headers {
			c.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: take(h.Value)}
		}
	}
	return &c
}

// signalLocked wakes a Receive waiting for records.
func (r *Receiver) signalLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// committableLocked returns the offsets settled since the last commit, and marks them
// committed.
func (r *Receiver) committableLocked(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	var offs map[string]map[int32]kgo.EpochOffset
	add := func(p *partition) {
		if p.done.Offset <= p.committed {
			return
		}
		if offs == nil {
			offs = map[string]map[int32]kgo.EpochOffset{}
		}
		if offs[p.topic] == nil {
			offs[p.topic] = map[int32]kgo.EpochOffset{}
		}
		offs[p.topic][p.partition] = p.done
		p.committed = p.done.Offset
	}
	if only == nil {
		for _, p := range r.parts {
			add(p)
		}
		return offs
	}
	for t, ps := range only {
		for _, n := range ps {
			if p := r.parts[topicPartition{t, n}]; p != nil {
				add(p)
			}
		}
	}
	return offs
}

// commitAsync commits settled offsets unless a commit is in flight; commits are ordered,
// so a later one never goes back.
func (r *Receiver) commitAsync() {
	r.mu.Lock()
	if r.committing || r.closed {
		r.mu.Unlock()
		return
	}
	offs := r.committableLocked(nil)
	if offs == nil {
		r.mu.Unlock()
		return
	}
	r.committing = true
	r.mu.Unlock()
	r.cl.CommitOffsets(r.cl.Context(), offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.committing = false
		if failed := r.commitFailures(offs, resp, err); failed != nil {
			r.cfg.Logger.Warn("outboxkafka: commit failed; retrying with the next one", "group", r.cfg.Group, "err", failed)
		}
	})
}

// commitFailures returns what failed in a commit of offs, and forgets the failed offsets
// as committed so the next commit sends them again.
func (r *Receiver) commitFailures(offs map[string]map[int32]kgo.EpochOffset, resp *kmsg.OffsetCommitResponse, err error) error {
	retry := func(t string, n int32) {
		if p := r.parts[topicPartition{t, n}]; p != nil && p.committed == offs[t][n].Offset {
			p.committed = -1
		}
	}
	if err != nil {
		for t, ps := range offs {
			for n := range ps {
				retry(t, n)
			}
		}
		return err
	}
	var errs []error
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
				retry(t.Topic, p.Partition)
				errs = append(errs, fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, perr))
			}
		}
	}
	return errors.Join(errs...)
}

// onAssigned starts tracking newly assigned partitions.
func (r *Receiver) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, ps := range assigned {
		for _, n := range ps {
			tp := topicPartition{t, n}
			if r.parts[tp] == nil {
				r.parts[tp] = &partition{topicPartition: tp, committed: -1, done: kgo.EpochOffset{Epoch: -1, Offset: -1}}
				r.order = append(r.order, tp)
			}
		}
	}
	r.signalLocked()
}

// onRevoked lets partitions go: it stops handing out their records, waits up to
// RevokeTimeout for those being handled, commits what was settled and forgets the rest
// (the next owner fetches it from the committed offset).
func (r *Receiver) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	r.mu.Lock()
	wait := !r.closed
	for t, ps := range revoked {
		for _, n := range ps {
			if p := r.parts[topicPartition{t, n}]; p != nil {
				p.revoked = true
			}
		}
	}
	r.mu.Unlock()
	if wait {
		r.waitSettled(ctx, revoked)
	}
	r.mu.Lock()
	offs := r.committableLocked(revoked)
	r.mu.Unlock()
	if offs != nil {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.RevokeTimeout+5*time.Second)
		cl.CommitOffsetsSync(cctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if failed := r.commitFailures(offs, resp, err); failed != nil {
				r.cfg.Logger.Warn("outboxkafka: commit of revoked partitions failed; their new owner redelivers what was handled since the last commit",
					"group", r.cfg.Group, "err", failed)
			}
		})
		cancel()
	}
	r.forget(revoked)
}

// onLost forgets partitions the group took away without a revocation: their offsets can
// no longer be committed by this member.
func (r *Receiver) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	r.forget(lost)
}

// waitSettled waits until the partitions have no record handed out, RevokeTimeout passes
// or ctx ends.
func (r *Receiver) waitSettled(ctx context.Context, ps map[string][]int32) {
	timeout := time.NewTimer(r.cfg.RevokeTimeout)
	defer timeout.Stop()
	for {
		r.mu.Lock()
		busy := false
		for t, ns := range ps {
			for _, n := range ns {
				if p := r.parts[topicPartition{t, n}]; p != nil && p.outstanding > 0 {
					busy = true
				}
			}
		}
		wake := r.changed
		r.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-wake:
		case <-timeout.C:
			r.cfg.Logger.Warn("outboxkafka: revoking partitions with records still being handled; their new owner delivers them again",
				"group", r.cfg.Group, "revoke_timeout", r.cfg.RevokeTimeout)
			return
		case <-ctx.Done():
			return
		}
	}
}

// forget drops the partitions' state, keeping the attempt counts of their unsettled
// records in case they come back to this receiver.
func (r *Receiver) forget(ps map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, ns := range ps {
		for _, n := range ns {
			tp := topicPartition{t, n}
			p := r.parts[tp]
			if p == nil {
				continue
			}
			for _, rc := range p.recs {
				r.heldBytes -= rc.size
				if rc.state != stateSettled && rc.attempt > 0 {
					if len(r.carried) >= maxCarried {
						clear(r.carried) // attempt counts are best effort; memory is not
					}
					r.carried[recordID{tp, rc.rec.Offset}] = rc.attempt
				}
			}
			delete(r.parts, tp)
			for i, o := range r.order {
				if o == tp {
					r.order = append(r.order[:i], r.order[i+1:]...)
					break
				}
			}
		}
	}
	r.next = 0
	r.signalLocked()
}

// Close commits what was settled, leaves the group and closes the client. Records handed
// out and not yet settled are delivered again to whoever owns their partition next. Stop
// the consumer before closing its receiver. Close is safe to call more than once.
func (r *Receiver) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	offs := r.committableLocked(nil)
	r.signalLocked()
	r.mu.Unlock()
	var err error
	if offs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RevokeTimeout+5*time.Second)
		r.cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, cerr error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if failed := r.commitFailures(offs, resp, cerr); failed != nil {
				err = fmt.Errorf("outboxkafka: committing on close (what was handled since the last commit is delivered again): %w", failed)
			}
		})
		cancel()
	}
	r.cl.CloseAllowingRebalance()
	return err
}

// delivery is one hand-out of a record.
type delivery struct {
	r       *Receiver
	rc      *record
	attempt int
}

// Message returns the decoded event, or an *outbox.MalformedError (wrapping
// outbox.ErrMalformed) for a record that is not a txoutbox CloudEvent; such a delivery can
// still be acked.
func (d *delivery) Message() (outbox.Message, error) { return d.rc.msg, d.rc.err }

// Attempt counts this record's deliveries by this receiver, 1 on the first; see the
// package documentation for what survives a rebalance.
func (d *delivery) Attempt() int { return d.attempt }

// Ack settles the record: the group's offset moves past it once every earlier record of
// its partition is settled too. The commit is sent by a later Receive (or Close, or a
// rebalance), not waited for here.
func (d *delivery) Ack(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.r.settle(d, true, 0)
}

// Nack hands the record out again after delay. Later records of its key in its partition
// wait for it; other keys and partitions go on.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.r.settle(d, false, delay)
}

func (d *delivery) describe() string {
	if d.rc.err == nil {
		return fmt.Sprintf("message %s (record %s)", d.rc.msg.ID, brokerID(d.rc.rec))
	}
	return "record " + brokerID(d.rc.rec)
}

var _ outbox.Receiver = (*Receiver)(nil)

// MessagingSystem returns "kafka", for telemetry ([outbox.Describer]).
func (r *Receiver) MessagingSystem() string { return messagingSystem }

// DestinationName returns the Receiver's topic when it reads one; each delivery names its
// own topic.
func (r *Receiver) DestinationName(outbox.Message) string {
	if len(r.cfg.Topics) == 1 {
		return r.cfg.Topics[0]
	}
	return ""
}

// MessagingSystem returns "kafka".
func (d *delivery) MessagingSystem() string { return messagingSystem }

// DestinationName returns the topic of the record.
func (d *delivery) DestinationName(outbox.Message) string { return d.rc.rec.Topic }
