package outboxnats

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The Sender publishes with core NATS and reads the stream's publish acks itself, where
// jetstream's PublishMsgAsync would register a future (a map entry and two channels) per
// message and decode every ack with encoding/json: per event that bookkeeping cost more CPU
// than building and writing the message (BenchmarkJetStream). The protocol is the same:
// each message carries a reply subject, and the stream answers there with a PubAck, an
// API error, or (no stream captures the subject) an empty "503" no-responders status.

// Like jetstream's async publish, a no-responders reply is retried twice, 250 ms apart (a
// stream being created or changing leader answers nobody for a moment), before it fails.
const (
	noRespondersRetries = jetstream.DefaultPubRetryAttempts
	noRespondersWait    = jetstream.DefaultPubRetryWait
)

// ackRouter receives the publish acks of every Send of one Sender on one subscription to
// the reply subjects "<inbox>.<send id>.<message index>".
type ackRouter struct {
	setup  sync.Mutex // guards sub and prefix while they are created
	sub    *nats.Subscription
	prefix string // "<inbox>."

	mu    sync.Mutex
	sends map[uint64]*pending // the Sends waiting for acks
	next  uint64
}

// pending is one Send's published messages waiting for their acks.
type pending struct {
	id     uint64
	prefix string // reply subject prefix: "<inbox>.<id>."
	nc     *nats.Conn
	reply  []byte // publish's buffer

	rebuild func(index int) (*nats.Msg, error) // the message at index, for a retry

	mu        sync.Mutex
	published []bool // by index in the batch
	acked     []bool
	errs      []error // the stream's answer: nil for stored (or dropped as a duplicate)
	acks      []*jetstream.PubAck
	retries   []int8 // no-responders retries spent
	inFlight  int    // published and not acknowledged
	done      bool   // the Send returned: late acks and retries are dropped
	changed   chan struct{}
	wantAcks  bool // keep the decoded PubAcks (Sender.onAck)
}

// start subscribes to the acks on first use and registers a Send of n messages.
func (r *ackRouter) start(nc *nats.Conn, n int, wantAcks bool, rebuild func(int) (*nats.Msg, error)) (*pending, error) {
	if err := r.subscribe(nc); err != nil {
		return nil, err
	}
	p := &pending{
		nc:        nc,
		rebuild:   rebuild,
		published: make([]bool, n),
		acked:     make([]bool, n),
		errs:      make([]error, n),
		retries:   make([]int8, n),
		changed:   make(chan struct{}, 1),
		wantAcks:  wantAcks,
	}
	if wantAcks {
		p.acks = make([]*jetstream.PubAck, n)
	}
	r.mu.Lock()
	r.next++
	p.id = r.next
	p.prefix = r.prefix + strconv.FormatUint(p.id, 10) + "."
	r.sends[p.id] = p
	r.mu.Unlock()
	return p, nil
}

// finish unregisters p: acks that arrive later are dropped.
func (r *ackRouter) finish(p *pending) {
	r.mu.Lock()
	delete(r.sends, p.id)
	r.mu.Unlock()
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
}

func (r *ackRouter) subscribe(nc *nats.Conn) error {
	r.setup.Lock()
	defer r.setup.Unlock()
	if r.sub != nil {
		return nil
	}
	inbox := nc.NewInbox()
	sub, err := nc.Subscribe(inbox+".*.*", r.receive)
	if err != nil {
		return fmt.Errorf("outboxnats: subscribing to publish acks on %s.*.*: %w", inbox, err)
	}
	r.sends = map[uint64]*pending{}
	r.sub, r.prefix = sub, inbox+"."
	return nil
}

// receive routes one ack to its Send; it runs on the subscription's goroutine.
func (r *ackRouter) receive(m *nats.Msg) {
	rest, ok := strings.CutPrefix(m.Subject, r.prefix)
	if !ok {
		return
	}
	idText, indexText, ok := strings.Cut(rest, ".")
	if !ok {
		return
	}
	id, err1 := strconv.ParseUint(idText, 10, 64)
	index, err2 := strconv.Atoi(indexText)
	if err1 != nil || err2 != nil {
		return
	}
	r.mu.Lock()
	p := r.sends[id]
	r.mu.Unlock()
	if p != nil {
		p.receive(index, m)
	}
}

// publish sends msg, the message at index, asking for its ack. Only the Send calls it.
func (p *pending) publish(index int, msg *nats.Msg) error {
	p.reply = strconv.AppendInt(append(p.reply[:0], p.prefix...), int64(index), 10)
	msg.Reply = string(p.reply)
	p.mu.Lock()
	p.published[index] = true
	p.inFlight++
	p.mu.Unlock()
	if err := p.nc.PublishMsg(msg); err != nil {
		p.mu.Lock()
		p.published[index] = false
		p.inFlight--
		p.mu.Unlock()
		return err
	}
	return nil
}

func (p *pending) receive(index int, m *nats.Msg) {
	if index < 0 || index >= len(p.published) {
		return
	}
	noResponders := len(m.Data) == 0 && m.Header.Get("Status") == "503"
	var (
		ack *jetstream.PubAck
		err error
	)
	if !noResponders {
		ack, err = parseAck(m.Data, p.wantAcks)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done || !p.published[index] || p.acked[index] {
		return
	}
	if noResponders {
		if p.retries[index] < noRespondersRetries {
			p.retries[index]++
			time.AfterFunc(noRespondersWait, func() { p.republish(index) })
			return
		}
		err = jetstream.ErrNoStreamResponse
	}
	p.acked[index], p.errs[index] = true, err
	if p.acks != nil {
		p.acks[index] = ack
	}
	p.inFlight--
	p.signal()
}

// republish sends a message again after a no-responders reply, unless its Send is over.
func (p *pending) republish(index int) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done {
		return
	}
	msg, err := p.rebuild(index)
	if err == nil {
		msg.Reply = p.prefix + strconv.Itoa(index)
		err = p.nc.PublishMsg(msg)
	}
	if err != nil {
		p.mu.Lock()
		if !p.done && !p.acked[index] {
			p.acked[index], p.errs[index] = true, err
			p.inFlight--
			p.signal()
		}
		p.mu.Unlock()
	}
}

// signal wakes the Send waiting in wait; p.mu is held.
func (p *pending) signal() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// wait returns once at most limit messages wait for their acks, or with ctx's error.
func (p *pending) wait(ctx context.Context, limit int) error {
	for {
		p.mu.Lock()
		n := p.inFlight
		p.mu.Unlock()
		if n <= limit {
			return nil
		}
		select {
		case <-p.changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// outcome returns the stream's answer for the message at index: ok once it has answered.
func (p *pending) outcome(index int) (ack *jetstream.PubAck, ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.acked[index] {
		return nil, false, nil
	}
	if p.acks != nil {
		ack = p.acks[index]
	}
	return ack, true, p.errs[index]
}

// parseAck reads a publish ack: nil for a message the stream stored (or dropped as a
// duplicate), the stream's API error, or ErrInvalidJSAck. A plain "stored" ack
// (nats-server writes {"stream":"NAME", "seq":N…}) is recognised without decoding it,
// unless full asks for the PubAck.
func parseAck(data []byte, full bool) (*jetstream.PubAck, error) {
	if !full && bytes.HasPrefix(data, []byte(`{"stream":"`)) && bytes.HasSuffix(data, []byte(`}`)) &&
		bytes.Contains(data, []byte(`"seq":`)) && !bytes.Contains(data, []byte(`"error"`)) {
		return nil, nil
	}
	var resp struct {
		jetstream.PubAck
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, fmt.Errorf("%w: %v", jetstream.ErrInvalidJSAck, err)
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	if resp.Stream == "" {
		return nil, jetstream.ErrInvalidJSAck
	}
	return &resp.PubAck, nil
}
