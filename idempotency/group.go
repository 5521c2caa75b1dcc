package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/internal/config"
)

// GroupConfig configures a [Group], and so the adapters' Idempotent. The zero value (or nil)
// means the defaults below.
type GroupConfig struct {
	// MaxEvents caps how many events share one transaction. Default 64. A batch can only
	// hold events handled at the same time, so the consumer's Concurrency caps it too.
	// 1 turns group commit off: every event is handled in a transaction of its own, exactly
	// as [Once] does it, as many at once as the consumer handles (MaxTransactions does not
	// apply). The default already runs slow handlers (a long query, a lock wait) side by
	// side, in smaller batches (see MaxTransactions); 1 makes it so from the first event.
	MaxEvents int
	// MaxTransactions caps how many batches run at once, each in its own transaction on
	// its own connection. Default 2: one batch fills while the other runs, which measured
	// about 20 % faster than 1 on PostgreSQL on two cores (a batch's statements are
	// sequential round trips, so one batch at a time leaves the database waiting on them).
	// A batch starts next to running ones only once as many events wait as each running
	// batch holds on average: a transaction's own round trips (BEGIN, the keys' insert,
	// COMMIT) are then shared by as many events as the others', where starting at once
	// would spend them on the first few, often one (with Concurrency 32 on two cores: ~40 %
	// more events/s, a third less CPU per event). An idle group starts a batch at once.
	// Left unset, the default is a floor, and the group sizes batches by time: a batch is
	// worth starting once the events waiting would spend twice a transaction's own time
	// (BEGIN, the keys' insert, COMMIT) in their handlers, which a batch runs one after
	// another, and as many batches may run as the events in the group fill. Slow handlers
	// then run side by side instead of queueing behind one another (a handler that takes
	// twice a transaction's own time gets a transaction per event, as with Once); quick
	// ones still share about 2 large batches. Set, it is a hard cap, and batches are sized
	// by count alone. SQLite has one writer: there, batches queue for it whatever this is.
	MaxTransactions int
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *GroupConfig) WithDefaults() *GroupConfig {
	out := GroupConfig{}
	if c != nil {
		out = *c
	}
	config.Default(&out.MaxEvents, 64)
	config.Default(&out.MaxTransactions, 2)
	return &out
}

// validate checks a config with defaults applied and returns every problem at once.
func (c *GroupConfig) validate() error {
	var errs []error
	if c.MaxEvents < 1 {
		errs = append(errs, fmt.Errorf("MaxEvents %d is below 1", c.MaxEvents))
	}
	if c.MaxTransactions < 1 {
		errs = append(errs, fmt.Errorf("MaxTransactions %d is below 1", c.MaxTransactions))
	}
	if len(errs) > 0 {
		return fmt.Errorf("idempotency: invalid GroupConfig: %w", errors.Join(errs...))
	}
	return nil
}

// Group is [Once] with group commit, and what the adapters' Idempotent runs: events handled
// at the same time share a transaction. Its Handle records a batch of up to MaxEvents events
// in one statement, runs h for the new ones one after another, and commits once; events that
// arrive meanwhile wait for the next batch (at most MaxTransactions batches run at once). One
// commit for many events takes a busy consumer past the database's commits per second, which
// bounds Once: on PostgreSQL, a consumer of 32 events at once with a one-INSERT handler
// handles more events per second with the inbox than the same handler without it, where Once
// reaches about three quarters of that. An event handled alone — an idle group, a consumer
// of one event at a time — is a batch of one, which is exactly Once. An event that arrives
// while a batch runs may wait for it to end, so that the next batch is worth its transaction
// (see MaxTransactions). A batch runs its handlers one after another, so a slow h (a long
// query, a lock wait) delays every event of its batch: by default the group sizes batches by
// the handlers' time, so slow handlers run side by side in small batches, down to one event
// each. A MaxTransactions that is set caps the batches running at once, and a group then
// handles at most about MaxTransactions events per duration of h. MaxEvents 1 is Once.
//
// The guarantee is Once's: h's effects commit exactly once per (consumer, event ID),
// together with the key. The contract is Once's too — h writes only through tx — with one
// addition: h may run more than once for an event, every run but the last rolled back. When
// any h of a batch fails (or the keys' insert, or the commit), the whole batch rolls back
// and each of its events is handled again in a transaction of its own, exactly as Once does
// it, with its own result. So one failing event never fails or duplicates the others, and
// it still gets the consumer's retries and dead-lettering; a panic in h reaches its own
// event's caller (the consumer turns it into a permanent error).
//
// One failure is not retried event by event: an error that [outbox.IsUnavailable] reports
// (the database down, or an error h marked with [outbox.Unavailable]). A transaction per
// event would only fail the same way, many times over; every event of the batch returns
// that error instead, and the consumer pauses and retries them without counting an
// attempt, as it does for Once.
//
// h receives each event's own ctx, so consumer.InfoFrom and tracing work as usual; the
// batch's own statements (BEGIN, the keys' insert, COMMIT) run on the ctx of the event that
// leads it. A call whose ctx ends while it waits for a batch returns ctx.Err() and is not
// handled; once its event is in a running batch, the call waits for that batch's outcome,
// so h never runs after its call returned. There is no background goroutine and nothing to
// close: the calls themselves take turns leading the batches.
type Group[TTx any, T outbox.Payload] struct {
	in     Inbox[TTx]
	h      TxHandler[TTx, T]
	single func(ctx context.Context, e outbox.Event[T]) error // Once: one event, one transaction
	max    int                                                // events per batch
	maxTx  int                                                // batches running at once (see worthBatch)
	adapt  bool                                               // MaxTransactions left to the group

	// Leader/follower protocol, all under mu. A call appends its item to queue. At most one
	// queued item is the designated leader (next), always the head of queue; it is designated
	// when there is none and the queue is worth a batch (worth: no batch runs, or fewer than
	// the limit do and the queue holds at least their average size, or a batch's fill; see
	// worthBatch). A call that enqueues checks this, and leads at once when it is the head.
	// A leader takes up to max items from the head of queue (its own first), runs them as
	// one transaction without mu, and on finishing checks it again: an item enqueued
	// meanwhile is therefore either taken, or designated, or waiting for a running batch to
	// finish — never stranded. Invariant: queue is non-empty only while next is set or a
	// batch runs. A waiting call whose ctx ends removes its item if not yet taken, passing
	// the designation on if it had it.
	//
	// Per-key order needs no care here: consumer.Consumer runs at most one event per key at a
	// time (its per-key queues in dispatch, whatever the transport), so no two batches, running
	// or not, hold events of one key — unless one Group is shared by several consumers.
	mu      sync.Mutex
	queue   []*groupItem[T] // waiting to be taken into a batch, in arrival order
	next    *groupItem[T]   // the designated leader of the next batch (queue[0]), or nil
	running int             // batches taken and not finished
	inBatch int             // events in those batches
	// Moving averages, in seconds, of a handler call's time and of a committed transaction's
	// time outside its handlers (BEGIN, the keys' insert, COMMIT): see fill.
	handlerTime, ownTime float64
}

// NewGroup returns the group-commit handler of h over in; pass its Handle to
// consumer.Handle. Each Group batches its own calls: use one per consumer and event type.
// cfg nil means the defaults; an invalid cfg (a negative field) panics, as a duplicate
// handler does: it is a mistake in the code that registers the handler.
func NewGroup[TTx any, T outbox.Payload](in Inbox[TTx], h TxHandler[TTx, T], cfg *GroupConfig) *Group[TTx, T] {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		panic(err)
	}
	return &Group[TTx, T]{in: in, h: h, single: Once(in, h), max: c.MaxEvents, maxTx: c.MaxTransactions,
		adapt: cfg == nil || cfg.MaxTransactions == 0}
}

// Waiting returns how many calls wait for a batch (not yet taken into one): a gauge of how
// far the database is behind the consumer.
func (g *Group[TTx, T]) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

type groupItem[T outbox.Payload] struct {
	ctx   context.Context
	e     outbox.Event[T]
	key   Key
	state itemState   // guarded by Group.mu
	sig   chan signal // receives at most one signal; buffered, so senders never block
	err   error       // with sigUnavailable: the batch's error (written before the signal)
}

type itemState uint8

const (
	queued itemState = iota // waiting in queue
	leader                  // the designated leader: head of queue, to lead the next batch
	taken                   // in a running batch; its call waits for the outcome
)

type signal uint8

const (
	sigLead        signal = iota + 1 // lead the next batch
	sigCommitted                     // the batch committed: the event is handled
	sigAlone                         // the batch rolled back: handle the event in its own transaction
	sigUnavailable                   // the batch failed for unavailability (err): so does the event
)

// Handle handles e in the next batch (a consumer.Handler).
func (g *Group[TTx, T]) Handle(ctx context.Context, e outbox.Event[T]) error {
	if g.max == 1 { // group commit off
		return g.single(ctx, e)
	}
	key, err := EventKey(ctx, e.ID)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	it := &groupItem[T]{ctx: ctx, e: e, key: key, sig: make(chan signal, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, it)
	if g.next == nil && g.worthBatch() && g.queue[0] == it { // lead at once
		g.next, it.state = it, leader
		g.mu.Unlock()
		return g.lead(it)
	}
	g.designate()
	g.mu.Unlock()

	select {
	case s := <-it.sig:
		return g.follow(it, s)
	case <-ctx.Done():
	}
	g.mu.Lock()
	if it.state == taken { // too late to withdraw: wait for the batch, whose h calls use ctx
		g.mu.Unlock()
		return g.follow(it, <-it.sig)
	}
	g.withdraw(it)
	g.mu.Unlock()
	return ctx.Err()
}

// withdraw, under mu, removes a cancelled item that was not taken, passing its designation
// on if it had one.
func (g *Group[TTx, T]) withdraw(it *groupItem[T]) {
	g.queue = slices.DeleteFunc(g.queue, func(x *groupItem[T]) bool { return x == it })
	if g.next == it {
		g.next = nil
		g.designate()
	}
}

// worthBatch reports, under mu, whether the queue is worth a batch now: no batch runs, or
// a transaction slot is free (see limit) and the queue holds at least as many events as a
// running batch does on average, or as many as fill a batch's time (see fill).
func (g *Group[TTx, T]) worthBatch() bool {
	if len(g.queue) == 0 {
		return false
	}
	if g.running == 0 {
		return true
	}
	fill := g.fill()
	limit := g.maxTx
	if fill > 0 { // the group chooses: as many transactions as the events in it fill
		limit = max(limit, int(math.Ceil(float64(len(g.queue)+g.inBatch)/fill)))
	}
	return g.running < limit && (len(g.queue)*g.running >= g.inBatch || fill > 0 && float64(len(g.queue)) >= fill)
}

// fill, under mu, is how many events fill a batch when the group chooses its transactions
// (MaxTransactions unset): as many as spend twice a transaction's own time (BEGIN, the
// keys' insert, COMMIT) in their handlers, at least 1; 0 otherwise, and until a transaction
// committed. A batch runs its handlers one after another, so with slow handlers a few
// large batches leave the events waiting on one another's handlers rather than on the
// database: once that many events wait, they are worth a transaction of their own, and the
// events in the group may run in as many transactions as they fill (MaxTransactions at
// least). Quick handlers fill a batch with many events, and the group runs about
// MaxTransactions large batches; a handler that takes twice a transaction's own time fills
// it alone, and the group runs a transaction per event, as Once does.
func (g *Group[TTx, T]) fill() float64 {
	if !g.adapt || g.ownTime <= 0 {
		return 0
	}
	if g.handlerTime <= 0 {
		return float64(g.max)
	}
	return min(float64(g.max), max(1, 2*g.ownTime/g.handlerTime))
}

// designate, under mu, makes the head of queue the next leader if there is none yet and the
// queue is worth a batch.
func (g *Group[TTx, T]) designate() {
	if g.next != nil || !g.worthBatch() {
		return
	}
	g.next = g.queue[0]
	g.next.state = leader
	g.next.sig <- sigLead
}

// follow finishes a waiting call after signal s.
func (g *Group[TTx, T]) follow(it *groupItem[T], s signal) error {
	switch s {
	case sigLead:
		if err := it.ctx.Err(); err != nil { // cancelled just as it was designated
			g.mu.Lock()
			g.withdraw(it)
			g.mu.Unlock()
			return err
		}
		return g.lead(it)
	case sigCommitted:
		return nil
	case sigUnavailable:
		return it.err
	default:
		return g.single(it.ctx, it.e)
	}
}

// lead runs one batch headed by me, the designated leader, and delivers its outcome.
func (g *Group[TTx, T]) lead(me *groupItem[T]) error {
	g.mu.Lock()
	n := min(len(g.queue), g.max)
	batch := slices.Clone(g.queue[:n]) // batch[0] is me: the designated leader is the head
	g.queue = slices.Delete(g.queue, 0, n)
	for _, it := range batch {
		it.state = taken
	}
	g.next = nil
	g.running++
	g.inBatch += n
	g.designate() // more than max queued: the rest may start in another transaction
	g.mu.Unlock()

	// Free the slot, designate, and release the followers on every way out, a panic too (of
	// h in a batch of one, which then reaches the consumer's recover), so no call is ever
	// left waiting.
	delivered := false
	defer func() {
		if !delivered {
			g.finish(n)
			for _, it := range batch[1:] {
				it.sig <- sigAlone
			}
		}
	}()
	if len(batch) == 1 {
		// Nothing to group: exactly Once, and its error is this event's own.
		var inH time.Duration
		calls := 0
		start := time.Now()
		err := Once(g.in, func(ctx context.Context, tx TTx, e outbox.Event[T]) error {
			t := time.Now()
			defer func() { inH, calls = inH+time.Since(t), calls+1 }()
			return g.h(ctx, tx, e)
		})(me.ctx, me.e)
		delivered = true
		g.finishTimed(n, err == nil, inH, calls, time.Since(start))
		return err
	}
	start := time.Now()
	inH, calls, err := g.runBatch(me.ctx, batch)
	// First, so that the next batch starts while this one's calls return.
	g.finishTimed(n, err == nil, inH, calls, time.Since(start))
	s := sigCommitted
	switch {
	case err == nil:
	case outbox.IsUnavailable(err):
		// The database (or what h marked unavailable) is down: a transaction per event
		// would only fail the same way, many times over. Every event gets the error, and
		// the consumer pauses and retries them, counting no attempt.
		s = sigUnavailable
	default:
		s = sigAlone
	}
	for _, it := range batch[1:] {
		it.err = err
		it.sig <- s
	}
	delivered = true
	switch s {
	case sigUnavailable:
		return err
	case sigAlone:
		return g.single(me.ctx, me.e)
	}
	return nil
}

// movingAverage adds x to the exponential moving average *avg, in which the newest value
// weighs 1/8; the first value is taken as it is.
func movingAverage(avg *float64, x float64) {
	if *avg == 0 {
		*avg = x
		return
	}
	*avg += (x - *avg) / 8
}

// finish frees the transaction slot of a batch of n events.
func (g *Group[TTx, T]) finish(n int) { g.finishTimed(n, false, 0, 0, 0) }

// finishTimed is finish, and if the batch committed, adds its handler calls' mean time (inH
// over calls) and its own time (total less inH) to the moving averages that fill reads.
func (g *Group[TTx, T]) finishTimed(n int, committed bool, inH time.Duration, calls int, total time.Duration) {
	g.mu.Lock()
	if committed && g.adapt {
		movingAverage(&g.ownTime, max(total-inH, 0).Seconds())
		if calls > 0 {
			movingAverage(&g.handlerTime, inH.Seconds()/float64(calls))
		}
	}
	g.running--
	g.inBatch -= n
	g.designate()
	g.mu.Unlock()
}

// runBatch handles batch in one transaction on ctx (the leader's), each h with its event's
// own ctx. Any error rolls the whole batch back. It deliberately uses no SAVEPOINTs to
// isolate a failing h: on PostgreSQL each subtransaction that writes takes its own
// subtransaction ID until the top-level commit, and more than 64 of them overflow the
// per-backend subxid cache (PGPROC), a known cliff that slows snapshots on every connection.
// Re-running the batch's events one by one costs a failure a few extra transactions instead.
func (g *Group[TTx, T]) runBatch(ctx context.Context, batch []*groupItem[T]) (inH time.Duration, calls int, err error) {
	keys := make([]Key, len(batch))
	for i, it := range batch {
		keys[i] = it.key
	}
	var fresh []bool
	err = g.in.InTx(ctx, func(tx TTx) error {
		var err error
		if fresh, err = g.in.RecordMany(ctx, tx, keys); err != nil {
			return err
		}
		for i, it := range batch {
			if !fresh[i] {
				continue // handled before, or a duplicate delivery in this very batch
			}
			t := time.Now()
			err := callTx(it.ctx, g.h, tx, it.e)
			inH += time.Since(t)
			calls++
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil { // only a committed batch's duplicates are final
		for i, it := range batch {
			if !fresh[i] {
				consumer.MarkDuplicate(it.ctx)
			}
		}
	}
	return inH, calls, err
}

// callTx runs h, turning a panic into an error so the batch rolls back and every event in it
// is handled alone; the panicking one panics again there, in its own caller.
func callTx[TTx any, T outbox.Payload](ctx context.Context, h TxHandler[TTx, T], tx TTx, e outbox.Event[T]) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("idempotency: handler panicked: %v", p)
		}
	}()
	return h(ctx, tx, e)
}
