package outboxpgx_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest/oteltest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/idempotency"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// statsCounter counts the stats statements a pool runs (a pgx tracer).
type statsCounter struct{ n atomic.Int64 }

func (s *statsCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "status = 'pending'") {
		s.n.Add(1)
	}
	return ctx
}

func (*statsCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestMetricsFollowTheEvents: with an SDK meter provider read by a manual reader, every
// metric of the relay and the consumer moves as events flow, fail, are retried,
// dead-lettered (at both stages) and replayed; the outbox gauges cost one statement per
// collection; OnDeadLetter fires once per dead letter, from both stages.
func TestMetricsFollowTheEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := pgxtest.New(t, "outboxpgx_metrics")
	cfg, err := pgxpool.ParseConfig(pgxtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	stats := &statsCounter{}
	cfg.ConnConfig.Tracer = stats
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := o.NewStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	mp, reader := oteltest.Metrics(t)

	// The broker: held shut until the test opens it; it refuses Poison until fixed, and
	// fails "flaky" once.
	var (
		gate      = make(chan struct{})
		mu        sync.Mutex
		refuse    = true
		flakyOnce = true
	)
	q := outboxmemory.New(&outboxmemory.Config{Name: "notes", VisibilityTimeout: time.Minute, SendHook: func(m outbox.Message) error {
		<-gate
		mu.Lock()
		defer mu.Unlock()
		switch {
		case m.Type == "outboxtest.poison" && refuse:
			return outbox.Permanent(errors.New("broker refuses poison"))
		case strings.Contains(string(m.Body), "flaky") && flakyOnce:
			flakyOnce = false
			return errors.New("broker hiccup")
		}
		return nil
	}})

	var (
		hookMu sync.Mutex
		hooked []deadletter.Notice
	)
	hook := func(_ context.Context, d deadletter.Notice) {
		hookMu.Lock()
		defer hookMu.Unlock()
		hooked = append(hooked, d)
	}
	hooks := func() []deadletter.Notice {
		hookMu.Lock()
		defer hookMu.Unlock()
		return slices.Clone(hooked)
	}

	o.Commit(t, outbox.New(outboxtest.Note{Text: "n1"}), outbox.New(outboxtest.Note{Text: "n2"}),
		outbox.New(outboxtest.Note{Text: "flaky"}), outbox.New(outboxtest.Note{Text: "bad"}),
		outbox.New(outboxtest.Note{Text: "fails-once"}), outbox.New(outboxtest.Poison{N: 1}, outbox.WithKey("p")))

	relay, err := relay.New(store, q, &relay.Config{MeterProvider: mp, OnDeadLetter: hook,
		RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			t.Error(err)
		}
	}()

	// While the broker holds the first send, the gauges see the backlog, one statement per
	// collection.
	var snap oteltest.Snapshot
	outboxtest.WaitFor(t, 10*time.Second, "the backlog gauge", func() bool {
		snap = reader.Collect()
		return snap.Value("txoutbox.outbox.backlog") == 6
	})
	before := stats.n.Load()
	for range 3 {
		snap = reader.Collect()
	}
	if got := stats.n.Load() - before; got != 3 {
		t.Errorf("3 collections ran %d stats statements, want 3", got)
	}
	if snap.Value("txoutbox.outbox.oldest_age") <= 0 || snap.Value("txoutbox.dead_letters.pending") != 0 {
		t.Errorf("oldest_age %v, dead_letters.pending %v, want > 0 and 0",
			snap.Value("txoutbox.outbox.oldest_age"), snap.Value("txoutbox.dead_letters.pending"))
	}
	if snap.Value("txoutbox.outbox.backlog", "txoutbox.outbox="+o.Schema+".outbox") != 6 {
		t.Errorf("the backlog gauge is not labelled with its outbox %s.outbox", o.Schema)
	}
	close(gate)

	c, err := consumer.New(q, &consumer.Config{Name: "metrics", DeadLetters: o.DeadLetters(t), MeterProvider: mp,
		OnDeadLetter: hook, RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var failedOnce atomic.Bool
	consumer.Handle(c, outboxpgx.Idempotent(o.Outbox, o.Pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[outboxtest.Note]) error {
		switch {
		case e.Payload.Text == "bad":
			return outbox.Permanent(errors.New("cannot handle bad"))
		case e.Payload.Text == "fails-once" && failedOnce.CompareAndSwap(false, true):
			return errors.New("database busy")
		}
		return nil
	}, &idempotency.GroupConfig{MaxEvents: 1})) // one transaction per event: with group commit, fails-once could fail inside a batch and succeed alone, never counted as failed
	cctx, stopConsumer := context.WithCancel(ctx)
	consumerDone := make(chan error)
	go func() { consumerDone <- c.Run(cctx) }()
	defer func() {
		stopConsumer()
		if err := <-consumerDone; err != nil {
			t.Error(err)
		}
	}()

	const consumed = "txoutbox.consumer.messages"
	outboxtest.WaitFor(t, 20*time.Second, "every event to be settled", func() bool {
		snap = reader.Collect()
		return snap.Value(consumed, "txoutbox.outcome=handled") == 4 &&
			snap.Value(consumed, "txoutbox.outcome=dead_lettered") == 1 &&
			snap.Value("txoutbox.dead_letters.added", "txoutbox.stage=relay") == 1
	})
	// A redelivery of a handled event is an inbox hit.
	var n1 outbox.Message
	for _, m := range q.Sent() {
		if strings.Contains(string(m.Body), `"n1"`) {
			n1 = m
		}
	}
	if err := q.Send(ctx, []outbox.Message{n1}); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 10*time.Second, "the duplicate to be counted", func() bool {
		snap = reader.Collect()
		return snap.Value(consumed, "txoutbox.outcome=duplicate") == 1
	})
	snap = reader.Collect()
	want := map[string]float64{
		// relay: 5 sent, the flaky one failed once, the poison refused; consumer: 4 handled
		// (fails-once on its retry), fails-once failed once, bad dead-lettered, n1 again a
		// duplicate: 7 handler runs
		`messaging.client.sent.messages|error.type=`:                                5,
		`messaging.client.sent.messages|error.type=*`:                               2,
		`messaging.client.sent.messages|cloudevents.event_type=outboxtest.poison`:   1,
		`messaging.client.sent.messages|messaging.destination.name=notes`:           7,
		`messaging.client.sent.messages|messaging.system=memory`:                    7,
		`txoutbox.relay.latency`:                                                    5,
		`txoutbox.dead_letters.added|txoutbox.stage=relay`:                          1,
		`txoutbox.dead_letters.added|txoutbox.dead_letter.kind=permanent`:           2,
		`txoutbox.dead_letters.added|txoutbox.stage=consumer`:                       1,
		`txoutbox.consumer.messages|txoutbox.outcome=handled`:                       4,
		`txoutbox.consumer.messages|txoutbox.outcome=failed`:                        1,
		`txoutbox.consumer.messages|txoutbox.outcome=dead_lettered`:                 1,
		`txoutbox.consumer.messages|txoutbox.outcome=duplicate`:                     1,
		`txoutbox.consumer.messages|messaging.consumer.group.name=metrics`:          7,
		`messaging.process.duration|error.type=*`:                                   2,
		`messaging.process.duration|cloudevents.event_type=outboxtest.note`:         7,
		`messaging.process.duration|messaging.destination.name=notes`:               7,
		`txoutbox.dead_letters.pending`:                                             2,
		`txoutbox.outbox.backlog`:                                                   1,  // the poison event, holding its key
		`txoutbox.outbox.held_keys`:                                                 1,  // until its dead letter is replayed
		`txoutbox.outbox.oldest_age`:                                                -1, // the held event waits
		`messaging.client.operation.duration|messaging.operation.name=send`:         -1, // > 0
		`txoutbox.relay.batch.size`:                                                 -1,
		`txoutbox.dead_letters.oldest_age`:                                          -1,
		`txoutbox.consumer.messages|cloudevents.event_type=_OTHER`:                  0,
		`messaging.client.sent.messages|messaging.operation.name=send,error.type=*`: 2,
	}
	check := func(snap oteltest.Snapshot, want map[string]float64) {
		t.Helper()
		for k, v := range want {
			name, attrs, _ := strings.Cut(k, "|")
			var filter []string
			if attrs != "" {
				filter = strings.Split(attrs, ",")
			}
			got := snap.Value(name, filter...)
			if v < 0 && got <= 0 || v >= 0 && got != v {
				t.Errorf("%s = %v, want %v", k, got, map[bool]any{true: "> 0", false: v}[v < 0])
			}
		}
	}
	check(snap, want)

	// Replay the relay's dead letter once the broker accepts poison: it flows again, and no
	// consumer handles its type, so it is dead-lettered at the consumer stage.
	mu.Lock()
	refuse = false
	mu.Unlock()
	dl, err := o.DeadLetters(t).List(ctx, deadletter.Filter{Stage: deadletter.StageRelay})
	if err != nil || len(dl) != 1 {
		t.Fatalf("relay dead letters: %d, %v", len(dl), err)
	}
	if err := o.DeadLetters(t).Replay(ctx, dl[0].ID); err != nil {
		t.Fatal(err)
	}
	relay.Wake()
	outboxtest.WaitFor(t, 10*time.Second, "the replayed event to be dead-lettered by the consumer", func() bool {
		snap = reader.Collect()
		return snap.Value("txoutbox.dead_letters.added", "txoutbox.stage=consumer") == 2
	})
	// A collection samples the gauges before it reads the counters: collect again, so the
	// gauges see the rows the counters counted.
	snap = reader.Collect()
	check(snap, map[string]float64{
		`messaging.client.sent.messages|error.type=`:                                              6,
		`txoutbox.dead_letters.added|txoutbox.dead_letter.kind=unknown-type`:                      1,
		`txoutbox.dead_letters.added|cloudevents.event_type=_OTHER`:                               1,
		`txoutbox.consumer.messages|txoutbox.outcome=dead_lettered,cloudevents.event_type=_OTHER`: 1,
		`txoutbox.dead_letters.pending`:                                                           2, // one replayed, one new
	})
	// The replay released the key; the event leaves the outbox once its send is written back.
	outboxtest.WaitFor(t, 10*time.Second, "the held key to be released and the outbox empty", func() bool {
		snap = reader.Collect()
		return snap.Value("txoutbox.outbox.held_keys") == 0 && snap.Value("txoutbox.outbox.backlog") == 0
	})

	got := hooks()
	if len(got) != 3 {
		t.Fatalf("OnDeadLetter fired %d times, want 3 (one relay, two consumer dead letters): %+v", len(got), got)
	}
	stages := map[string]int{}
	for _, d := range got {
		stages[string(d.Stage)+"/"+string(d.Kind)]++
		if d.Destination != "notes" || d.Reason == "" || d.Attempts < 1 {
			t.Errorf("OnDeadLetter got %+v", d)
		}
	}
	if stages["relay/permanent"] != 1 || stages["consumer/permanent"] != 1 || stages["consumer/unknown-type"] != 1 {
		t.Errorf("OnDeadLetter by stage and kind: %v", stages)
	}
	rows, err := o.DeadLetters(t).List(ctx, deadletter.Filter{})
	if err != nil || len(rows) != len(got) {
		t.Errorf("%d dead letters in the table (%v), %d hook calls", len(rows), err, len(got))
	}
}

// TestIdempotencyHelpersReportDuplicates: a redelivered event counts as a duplicate, not as
// handled, whichever helper absorbs it: Idempotent (once its batch committed), Idempotent
// with one event per transaction, and SkipSeen.
func TestIdempotencyHelpersReportDuplicates(t *testing.T) {
	t.Parallel()
	o := pgxtest.New(t, "outboxpgx_dups")
	noop := func(context.Context, pgx.Tx, outbox.Event[outboxtest.Note]) error { return nil }
	for name, h := range map[string]consumer.Handler[outboxtest.Note]{
		"idempotent": outboxpgx.Idempotent(o.Outbox, o.Pool, noop, nil),
		"once":       outboxpgx.Idempotent(o.Outbox, o.Pool, noop, &idempotency.GroupConfig{MaxEvents: 1}),
		"skipseen":   outboxpgx.SkipSeen(o.Outbox, o.Pool, func(context.Context, outbox.Event[outboxtest.Note]) error { return nil }),
	} {
		t.Run(name, func(t *testing.T) {
			mp, reader := oteltest.Metrics(t)
			q := outboxmemory.New(nil)
			c, err := consumer.New(q, &consumer.Config{Name: name, DeadLetters: o.DeadLetters(t), MeterProvider: mp})
			if err != nil {
				t.Fatal(err)
			}
			consumer.Handle(c, h)
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- c.Run(ctx) }()
			defer func() {
				stop()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			m, err := outbox.New(outboxtest.Note{Text: name}).Encode()
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"txoutbox.outcome=handled", "txoutbox.outcome=duplicate"} {
				if err := q.Send(ctx, []outbox.Message{m}); err != nil {
					t.Fatal(err)
				}
				outboxtest.WaitFor(t, 10*time.Second, want, func() bool {
					return reader.Collect().Value("txoutbox.consumer.messages", want) == 1
				})
			}
			if snap := reader.Collect(); snap.Value("txoutbox.consumer.messages") != 2 {
				t.Errorf("%v deliveries counted, want 2", snap.Value("txoutbox.consumer.messages"))
			}
		})
	}
}
