package benchtest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/outbox"
)

// ReadyReceiver is a broker whose messages are all there: it hands out its messages in
// order, and its deliveries acknowledge at no cost. Consumer benchmarks measure the
// consumer, not a broker, with it.
type ReadyReceiver struct {
	msgs  []outbox.Message
	next  atomic.Int64
	acked atomic.Int64
	done  sync.WaitGroup
}

// NewReadyReceiver returns a ReadyReceiver of msgs.
func NewReadyReceiver(msgs []outbox.Message) *ReadyReceiver {
	r := &ReadyReceiver{msgs: msgs}
	r.done.Add(len(msgs))
	return r
}

// Receive returns up to limit of the next messages; once all were handed out, it waits
// for ctx to end.
func (r *ReadyReceiver) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	end := r.next.Add(int64(limit))
	start := end - int64(limit)
	if start >= int64(len(r.msgs)) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	end = min(end, int64(len(r.msgs)))
	ds := make([]outbox.Delivery, 0, end-start)
	for i := start; i < end; i++ {
		ds = append(ds, readyDelivery{r: r, m: &r.msgs[i]})
	}
	return ds, nil
}

// Wait returns once every message was acknowledged.
func (r *ReadyReceiver) Wait() { r.done.Wait() }

// Acked is how many acknowledgements the deliveries received.
func (r *ReadyReceiver) Acked() int64 { return r.acked.Load() }

type readyDelivery struct {
	r *ReadyReceiver
	m *outbox.Message
}

func (d readyDelivery) Message() (outbox.Message, error) { return *d.m, nil }
func (d readyDelivery) Attempt() int                     { return 1 }
func (d readyDelivery) Ack(context.Context) error {
	d.r.acked.Add(1)
	d.r.done.Done()
	return nil
}
func (d readyDelivery) Nack(context.Context, time.Duration) error { return nil }
