package outboxnats_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// The chaos tests run the whole pipeline — producers committing (and rolling back) events
// through outboxpgx, two relays, JetStream, a consumer whose idempotent handler writes one
// effect row per event — while something breaks underneath it, then check DESIGN.md's
// promise: 0 lost, 0 duplicate effects, 0 rolled-back events delivered, nothing
// dead-lettered.

// TestChaosDatabaseConnectionsKilled terminates every PostgreSQL backend of the relays' and
// the consumer's pools every 50–100 ms for 4 seconds, while producers keep committing.
// That is what a PostgreSQL restart looks like to a client — connections dropped, the
// transactions in flight rolled back, claims and write-backs and handler transactions cut
// anywhere — without disturbing the other tests that share the server. The pools carry an
// application_name of their own; the producers' pool is spared, so that the set of
// committed events is known exactly (a commit cut by a kill has an unknown outcome).
func TestChaosDatabaseConnectionsKilled(t *testing.T) {
	t.Parallel()
	p := pgxtest.New(t, "outboxnats")
	_, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{}, outboxnats.SenderConfig{})

	app := "txoutbox_chaos_" + unique()
	pl := newChaosPipeline(t, p, chaosSetup{
		relayPool:    chaosPool(t, app, 4),
		consumerPool: chaosPool(t, app, 12),
		stream:       d.stream,
		sender:       d.sender,
		receiver:     d.receiver,
	})
	pl.start()

	const chaosFor = 4 * time.Second
	chaos, stopChaos := context.WithTimeout(context.Background(), chaosFor)
	defer stopChaos()
	producing := pl.produce(chaos, 4)
	var rounds, killed int
	for chaos.Err() == nil {
		n, err := terminateBackends(p.Pool, app)
		if err != nil {
			t.Fatalf("terminating the backends of %s: %v", app, err)
		}
		rounds++
		killed += n
		select {
		case <-chaos.Done():
		case <-time.After(50*time.Millisecond + rand.N(50*time.Millisecond)):
		}
	}
	producing.Wait()
	chaosEnd := time.Now()
	t.Logf("chaos: %d rounds of pg_terminate_backend in %v killed %d backends", rounds, chaosFor, killed)
	// A relay or consumer whose connections fail pauses (the database is unavailable) and
	// reconnects only when it probes, so many rounds find nothing to kill; the test proves
	// something as long as the pipeline's connections were cut again and again.
	if killed < rounds/5 {
		t.Fatalf("only %d backends killed in %d rounds: the chaos missed the pipeline, the test proves nothing", killed, rounds)
	}

	pl.awaitSettled(60 * time.Second)
	t.Logf("settled %v after the chaos ended", time.Since(chaosEnd).Round(time.Millisecond))
	pl.stop()
	res := pl.verify()
	pl.logStats(res)
	if res.streamDuplicates != 0 {
		// Relay re-sends happen within seconds, well inside the stream's 2-minute dedup
		// window, and the broker never restarted: dedup is deterministic here.
		t.Errorf("the stream stored %d duplicate messages; Nats-Msg-Id dedup should have absorbed every re-send", res.streamDuplicates)
	}
	if pl.logs.count(relayDatabaseDown) == 0 && pl.logs.count("consumer: handler failed, will retry") == 0 {
		t.Error("neither the relays nor the consumer saw a database error: the chaos did not reach the pipeline")
	}
}

// TestChaosBrokerOutage runs the pipeline against a private nats-server (file storage),
// SIGKILLs the server mid-run, keeps it down for a second and a half while producers keep
// committing, and restarts it on the same port and store directory. Relay sends fail or
// lose their acks, consumer acks are lost, pull requests vanish; the clients reconnect and
// everything must still arrive exactly once in effect.
func TestChaosBrokerOutage(t *testing.T) {
	t.Parallel()
	p := pgxtest.New(t, "outboxnats")
	srv := startNATSServer(t)
	ncRelay, jsRelay := connectPrivate(t, srv, "chaos relays")
	ncCons, jsCons := connectPrivate(t, srv, "chaos consumer")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ackWait = 2 * time.Second // how soon a delivery whose ack was lost comes back
	top := outboxnats.Topology{Stream: "CHAOS", Subjects: []string{"chaos.>"}, AckWait: ackWait}
	stream, _, err := outboxnats.Provision(ctx, jsRelay, top)
	if err != nil {
		t.Fatal(err)
	}
	sender, err := outboxnats.NewSender(jsRelay, &outboxnats.SenderConfig{SubjectPrefix: "chaos", Stream: top.Stream})
	if err != nil {
		t.Fatal(err)
	}
	jc, err := jsCons.Consumer(ctx, top.Stream, top.Stream)
	if err != nil {
		t.Fatal(err)
	}
	// A short long-poll, so a pull request lost with the server is replaced quickly.
	receiver, err := outboxnats.NewReceiver(jc, &outboxnats.ReceiverConfig{MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}

	app := "txoutbox_chaos_" + unique() // not killed here; named for anyone watching pg_stat_activity
	pl := newChaosPipeline(t, p, chaosSetup{
		relayPool:    chaosPool(t, app, 4),
		consumerPool: chaosPool(t, app, 12),
		stream:       stream,
		sender:       sender,
		receiver:     receiver,
	})
	pl.start()
	production, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	producing := pl.produce(production, 4)

	outboxtest.WaitFor(t, 30*time.Second, "300 events to be handled before the outage", func() bool {
		return pl.handled.len() >= 300
	})
	before := pl.sender.stats()
	const outage = 1500 * time.Millisecond
	killedAt := time.Now()
	srv.Kill()
	outboxtest.WaitFor(t, 10*time.Second, "a relay send to fail while the broker is down", func() bool {
		return pl.sender.stats().failed > before.failed
	})
	time.Sleep(time.Until(killedAt.Add(outage))) // the outage lasts this long, whatever happens meanwhile
	pendingAtRestart := p.Count(t, "outbox")
	srv.Start()
	restartedAt := time.Now()
	outboxtest.WaitFor(t, 30*time.Second, "both connections to reconnect", func() bool {
		return ncRelay.IsConnected() && ncCons.IsConnected()
	})
	t.Logf("broker down for %v; %d events waiting in the outbox at restart; clients reconnected %v after the restart",
		restartedAt.Sub(killedAt).Round(time.Millisecond), pendingAtRestart, time.Since(restartedAt).Round(time.Millisecond))
	if ncRelay.Stats().Reconnects == 0 || ncCons.Stats().Reconnects == 0 {
		t.Errorf("reconnects: relays %d, consumer %d; want both to have reconnected", ncRelay.Stats().Reconnects, ncCons.Stats().Reconnects)
	}
	// Keep producing a little after the restart, so new events follow the backlog.
	time.Sleep(500 * time.Millisecond)
	stopProducing()
	producing.Wait()
	producedUntil := time.Now()

	pl.awaitSettled(60 * time.Second)
	t.Logf("settled %v after production ended", time.Since(producedUntil).Round(time.Millisecond))
	pl.stop()
	res := pl.verify()
	pl.logStats(res)
	// Not asserted: whether the restarted server still deduplicates a re-send depends on
	// what its store had on disk when it was killed.
	t.Logf("duplicates stored by the broker itself: %d", res.streamDuplicates)
}

// chaosSetup is what a chaos test hands the pipeline.
type chaosSetup struct {
	relayPool, consumerPool *pgxpool.Pool // the relays' store and the consumer's handler, inbox, dead letters
	stream                  jetstream.Stream
	sender                  *outboxnats.Sender
	receiver                *outboxnats.Receiver
	// maxAttempts is the relays' and the consumer's MaxAttempts; 0 is 100 (see start).
	maxAttempts int
}

// chaosPipeline is producers → outbox → two relays → JetStream → consumer → effects.
type chaosPipeline struct {
	t        *testing.T
	p        *pgxtest.Outbox
	setup    chaosSetup
	sender   *chaosSender
	receiver *countingReceiver
	store    *chaosStore
	relays   []*relay.Relay
	// onStateChange, when set before start, hears the relays' OnStateChange.
	onStateChange func(relay string, s relay.State)
	logs          *logCounter
	handled       idSet // every event a handler was called with, attempts and redeliveries included
	acks          struct {
		sync.Mutex
		total, duplicate int
	}
	stop func()

	mu         sync.Mutex
	published  [][]outbox.Encodable // committed events, per producer in commit order
	committed  map[uuid.UUID]bool
	rolledBack map[uuid.UUID]bool
	txs        int
	rollbacks  int
	killedTxs  int
}

const (
	chaosConsumer = "chaos"
	// relayDatabaseDown begins the relay's log message when a claim or write-back fails
	// (the relay then pauses and probes the database).
	relayDatabaseDown = "outbox relay: database unavailable"
)

func newChaosPipeline(t *testing.T, p *pgxtest.Outbox, s chaosSetup) *chaosPipeline {
	t.Helper()
	if _, err := p.Pool.Exec(context.Background(), "CREATE TABLE "+p.Schema+".effects (n bigserial, event_id uuid NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	pl := &chaosPipeline{
		t: t, p: p, setup: s,
		sender:     &chaosSender{Sender: s.sender},
		receiver:   &countingReceiver{Receiver: s.receiver},
		logs:       &logCounter{counts: map[string]int{}, lastErr: map[string]string{}},
		committed:  map[uuid.UUID]bool{},
		rolledBack: map[uuid.UUID]bool{},
	}
	outboxnats.SetOnAck(s.sender, func(_ outbox.Message, a *jetstream.PubAck) {
		pl.acks.Lock()
		defer pl.acks.Unlock()
		pl.acks.total++
		if a.Duplicate {
			pl.acks.duplicate++
		}
	})
	return pl
}

// start runs two relays and the consumer until stop (or the test's end).
func (pl *chaosPipeline) start() {
	t := pl.t
	t.Helper()
	logger := slog.New(pl.logs)
	relayStore, err := pl.p.Outbox.NewStore(pl.setup.relayPool)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := pl.p.Outbox.NewDeadLetters(pl.setup.consumerPool)
	if err != nil {
		t.Fatal(err)
	}
	store := &chaosStore{Store: relayStore}
	pl.store = store
	maxAttempts := pl.setup.maxAttempts
	if maxAttempts == 0 {
		maxAttempts = 100
	}
	var relays []*relay.Relay
	for i := range 2 {
		name := fmt.Sprintf("chaos-relay-%d", i)
		r, err := relay.New(store, pl.sender, &relay.Config{
			Name: name,
			OnStateChange: func(_ context.Context, s relay.State) {
				if pl.onStateChange != nil {
					pl.onStateChange(name, s)
				}
			},
			BatchSize: 100,
			// A write-back lost to the chaos leaves its batch leased: a short lease gets it
			// re-sent (and deduplicated by the stream) soon.
			Lease: 2 * time.Second,
			// A claim or write-back that fails pauses the relay until a probe gets through:
			// probing often keeps the relays at the database while the chaos lasts.
			UnavailableBackoff:    10 * time.Millisecond,
			MaxUnavailableBackoff: 100 * time.Millisecond,
			// Attempts count the database's chaos here, not faults of the events: a claim
			// whose write-back is lost has spent its attempts (a broker outage spends none:
			// the sender marks it outbox.Unavailable). Retries run 10× faster than the
			// default (100 ms up to 1 s instead of 1 s up to 5 min), so the default 10
			// attempts would span a few seconds: 100 span over a minute, like the default
			// budget in time, and no healthy event is dead-lettered.
			RetryBackoff:    100 * time.Millisecond,
			MaxRetryBackoff: time.Second,
			MaxAttempts:     maxAttempts,
			Logger:          logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	pl.relays = relays
	c, err := consumer.New(pl.receiver, &consumer.Config{
		Name:        chaosConsumer,
		DeadLetters: dead,
		// As for the relays: retries 10× faster than the default need more attempts to
		// span an outage. (Every kill fails the next statement on each pooled
		// connection, so one event may fail several times in a row: runs saw attempt 8.)
		RetryBackoff:    100 * time.Millisecond,
		MaxRetryBackoff: time.Second,
		MaxAttempts:     maxAttempts,
		Logger:          logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := idempotentEffect(pl.p.Outbox, pl.setup.consumerPool, pl.p.Schema)
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[orderPlaced]) error {
		info, _ := consumer.InfoFrom(ctx)
		pl.handled.add(e.ID, info.Attempt)
		return h(ctx, e)
	})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	var once sync.Once
	pl.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(pl.stop) // before the pools close, even if the test fails early
}

// produce runs n producers until ctx ends, each writing a transaction of 1–16 events (32–40
// every sixth) every 50 ms. Six in eight commit; one rolls back; one has its connection
// killed between Publish and Commit. Each producer owns its keys, and writes them one
// transaction at a time: per-key order is its commit order.
func (pl *chaosPipeline) produce(ctx context.Context, n int) *sync.WaitGroup {
	pl.published = make([][]outbox.Encodable, n)
	producers := chaosPool(pl.t, "txoutbox_producer_"+unique(), int32(n)) // never a chaos target
	var wg sync.WaitGroup
	for prod := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(prod), uint64(time.Now().UnixNano())))
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				size := 1 + rng.IntN(16)
				if i%6 == 5 {
					size = 32 + rng.IntN(9) // Publish writes 32 events or more with COPY
				}
				events := make([]outbox.Encodable, size)
				for j := range events {
					key := ""
					if rng.IntN(4) > 0 {
						key = fmt.Sprintf("p%d-k%d", prod, rng.IntN(8))
					}
					events[j] = outbox.New(orderPlaced{OrderID: fmt.Sprintf("p%d-t%d-e%d", prod, i, j)}, outbox.WithKey(key))
				}
				end := txCommit
				switch i % 8 {
				case 3:
					end = txKilled
				case 7:
					end = txRollback
				}
				if err := pl.publishTx(producers, events, end); err != nil {
					pl.t.Errorf("producer %d: %v", prod, err)
					return
				}
				commit := end == txCommit
				pl.mu.Lock()
				pl.txs++
				for _, e := range events {
					m, _ := e.Encode()
					if commit {
						pl.committed[m.ID] = true
					} else {
						pl.rolledBack[m.ID] = true
					}
				}
				switch end {
				case txCommit:
					pl.published[prod] = append(pl.published[prod], events...)
				case txRollback:
					pl.rollbacks++
				case txKilled:
					pl.killedTxs++
				}
				pl.mu.Unlock()
			}
		})
	}
	pl.t.Cleanup(wg.Wait) // a test that failed early still ends ctx first (its deferred cancel)
	return &wg
}

// How a producer's transaction ends.
type txEnd int

const (
	txCommit   txEnd = iota
	txRollback       // the producer rolls it back
	txKilled         // its backend is terminated before the commit, which must then fail
)

// publishTx publishes events in one transaction on pool (which no chaos touches: a commit
// cut by a kill has an unknown outcome) and ends it as told.
func (pl *chaosPipeline) publishTx(pool *pgxpool.Pool, events []outbox.Encodable, end txEnd) error {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var pid int32
	if end == txKilled {
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
	}
	if err := pl.p.Outbox.Publish(ctx, tx, events...); err != nil {
		return err
	}
	switch end {
	case txRollback:
		return tx.Rollback(ctx)
	case txKilled:
		var gone bool // pg_terminate_backend with a timeout waits until the backend has exited
		if err := pl.p.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&gone); err != nil || !gone {
			return fmt.Errorf("terminating the producer's backend %d: %v, %v", pid, gone, err)
		}
		if err := tx.Commit(ctx); err == nil {
			return fmt.Errorf("the commit of a transaction whose backend %d was terminated succeeded", pid)
		}
		return nil
	}
	return tx.Commit(ctx)
}

// awaitSettled waits until the outbox is empty and every committed event has its effect
// or a dead letter (which verify then reports).
func (pl *chaosPipeline) awaitSettled(timeout time.Duration) {
	pl.t.Helper()
	pl.mu.Lock()
	want := len(pl.committed)
	pl.mu.Unlock()
	var pending, effects, dead int
	s := pl.p.Schema
	defer func() {
		if pl.t.Failed() {
			pl.t.Logf("at the end of the wait: %d in the outbox, %d of %d effects, %d dead letters", pending, effects, want, dead)
		}
	}()
	outboxtest.WaitFor(pl.t, timeout, fmt.Sprintf("the outbox to drain and the %d committed events to take effect", want), func() bool {
		err := pl.p.Pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM `+s+`.outbox),
			(SELECT count(DISTINCT event_id) FROM `+s+`.effects),
			(SELECT count(*) FROM `+s+`.outbox_dead_letters)`).Scan(&pending, &effects, &dead)
		if err != nil {
			pl.t.Fatal(err)
		}
		return pending == 0 && effects+dead >= want
	})
}

type chaosResult struct {
	committed, rolledBack int
	effectRows            int // count(*) of the effects table
	effectEvents          int // count(DISTINCT event_id)
	streamMsgs            int
	streamDuplicates      int
}

// verify checks the end state, with the relays and the consumer stopped.
func (pl *chaosPipeline) verify() chaosResult {
	t := pl.t
	t.Helper()
	ctx := context.Background()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	res := chaosResult{committed: len(pl.committed), rolledBack: len(pl.rolledBack)}
	if res.committed < 500 || res.rolledBack == 0 {
		t.Errorf("only %d committed and %d rolled-back events: too few to prove anything", res.committed, res.rolledBack)
	}
	s := pl.p.Schema

	// Dead letters, first: they explain missing effects.
	rows, err := pl.p.Pool.Query(ctx, "SELECT event_id, stage, attempts, reason FROM "+s+".outbox_dead_letters ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var dead int
	for rows.Next() {
		var (
			id       uuid.UUID
			stage    string
			attempts int
			reason   string
		)
		if err := rows.Scan(&id, &stage, &attempts, &reason); err != nil {
			t.Fatal(err)
		}
		if dead++; dead <= 5 {
			t.Errorf("event %s dead-lettered by the %s after %d attempts: %s", id, stage, attempts, reason)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if dead > 0 {
		t.Errorf("%d dead letters; want none", dead)
	}

	// Effects: every committed event exactly once, nothing else.
	effects := map[uuid.UUID]int{}
	rows, err = pl.p.Pool.Query(ctx, "SELECT event_id, count(*) FROM "+s+".effects GROUP BY event_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var (
			id uuid.UUID
			n  int
		)
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		effects[id] = n
		res.effectRows += n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	res.effectEvents = len(effects)
	var lost, dupEvents, phantom, rolledBackEffects []string
	for id := range pl.committed {
		if effects[id] == 0 {
			lost = append(lost, id.String())
		}
	}
	for id, n := range effects {
		switch {
		case pl.rolledBack[id]:
			rolledBackEffects = append(rolledBackEffects, id.String())
		case !pl.committed[id]:
			phantom = append(phantom, id.String())
		}
		if n > 1 {
			dupEvents = append(dupEvents, fmt.Sprintf("%s×%d", id, n))
		}
	}
	report := func(what string, ids []string) {
		if len(ids) > 0 {
			sort.Strings(ids)
			t.Errorf("%d %s, e.g. %s", len(ids), what, strings.Join(ids[:min(5, len(ids))], ", "))
		}
	}
	report("committed events lost (no effect)", lost)
	report("events with duplicate effects", dupEvents)
	report("rolled-back events with an effect", rolledBackEffects)
	report("effects of events nobody published", phantom)
	if n := pl.p.Count(t, "outbox_inbox"); n != res.committed {
		t.Errorf("%d inbox rows; want one per committed event, %d", n, res.committed)
	}
	if n := pl.p.Count(t, "outbox"); n != 0 {
		t.Errorf("%d events left in the outbox", n)
	}
	var handledRolledBack []string
	for id := range pl.rolledBack {
		if pl.handled.has(id) {
			handledRolledBack = append(handledRolledBack, id.String())
		}
	}
	report("rolled-back events handed to the handler", handledRolledBack)

	// The stream: every committed event, in per-key order, no rolled-back one. Read through
	// a fresh consumer, from the first message.
	res.streamMsgs = int(streamMsgs(t, pl.setup.stream))
	jc, err := pl.setup.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "audit", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	audit, err := outboxnats.NewReceiver(jc, &outboxnats.ReceiverConfig{MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var inStream []outbox.Message
	seen := map[uuid.UUID]bool{}
	var streamRolledBack, streamPhantom []string
	for _, d := range outboxtest.ReceiveN(t, audit, res.streamMsgs, 30*time.Second) {
		m, err := d.Message()
		if err != nil {
			t.Fatal(err)
		}
		inStream = append(inStream, m)
		if seen[m.ID] {
			res.streamDuplicates++
		}
		seen[m.ID] = true
		switch {
		case pl.rolledBack[m.ID]:
			streamRolledBack = append(streamRolledBack, m.ID.String())
		case !pl.committed[m.ID]:
			streamPhantom = append(streamPhantom, m.ID.String())
		}
	}
	var streamLost []string
	for id := range pl.committed {
		if !seen[id] {
			streamLost = append(streamLost, id.String())
		}
	}
	report("rolled-back events in the stream", streamRolledBack)
	report("committed events missing from the stream", streamLost)
	report("unknown events in the stream", streamPhantom)
	var published []outbox.Encodable
	for _, evs := range pl.published {
		published = append(published, evs...)
	}
	outboxtest.CheckPerKeyOrder(t, published, inStream)
	return res
}

func (pl *chaosPipeline) logStats(res chaosResult) {
	t := pl.t
	t.Helper()
	ss := pl.sender.stats()
	pl.acks.Lock()
	acks, dupAcks := pl.acks.total, pl.acks.duplicate
	pl.acks.Unlock()
	t.Logf("events: %d committed, %d rolled back (%d transactions: %d rolled back, %d killed before their commit)",
		res.committed, res.rolledBack, pl.txs, pl.rollbacks, pl.killedTxs)
	t.Logf("relays: %d sends (%d failed) of %d messages; %d stream acks, %d of them for re-sends the stream deduplicated; "+
		"database unavailable %d times (%d in a claim, %d in a write-back); highest attempt claimed %d",
		ss.calls, ss.failed, ss.msgs, acks, dupAcks, pl.logs.count(relayDatabaseDown),
		pl.logs.count(relayDatabaseDown+" (claim)"), pl.logs.count(relayDatabaseDown+" (write-back)"), pl.store.highestAttempt())
	t.Logf("consumer: %d handler calls for %d events, %d of them redeliveries by attempt count; %d handler failures, %d failed acks, "+
		"%d failed receives; highest attempt %d",
		pl.handled.calls(), pl.handled.len(), pl.receiver.redeliveries(), pl.logs.count("consumer: handler failed, will retry"),
		pl.logs.count("consumer: ack failed"), pl.logs.count("consumer: receive failed"), pl.handled.highestAttempt())
	t.Logf("end state: %d effect rows for %d distinct events, %d messages in the stream", res.effectRows, res.effectEvents, res.streamMsgs)
	for msg, err := range pl.logs.samples() {
		t.Logf("  e.g. %s: %s", msg, err)
	}
}

// terminateBackends terminates every backend whose application_name is app and returns how
// many it terminated. The call stays in the select list: in the WHERE clause, the planner
// may evaluate it before the application_name filter, on every backend of the server.
func terminateBackends(admin *pgxpool.Pool, app string) (int, error) {
	rows, err := admin.Query(context.Background(),
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		var ok bool
		if err := rows.Scan(&ok); err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, rows.Err()
}

// chaosPool opens a pool whose connections carry application_name app, closed at cleanup.
func chaosPool(t *testing.T, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgxtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// chaosStore records the highest attempt number the relays claimed.
type chaosStore struct {
	outboxdriver.Store
	mu         sync.Mutex
	maxAttempt int
}

func (s *chaosStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	claimed, err := s.Store.Claim(ctx, p)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range claimed {
		s.maxAttempt = max(s.maxAttempt, c.Attempts)
	}
	return claimed, err
}

func (s *chaosStore) highestAttempt() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxAttempt
}

// chaosSender counts the relays' sends.
type chaosSender struct {
	outbox.Sender
	mu sync.Mutex
	s  sendStats
}

type sendStats struct {
	calls, failed, msgs int
	// maxGap is the longest time between two sends that succeeded in full.
	maxGap time.Duration
	lastOK time.Time
}

func (s *chaosSender) Send(ctx context.Context, msgs []outbox.Message) error {
	err := s.Sender.Send(ctx, msgs)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.s.calls++
	s.s.msgs += len(msgs)
	if err != nil {
		s.s.failed++
		return err
	}
	now := time.Now()
	if !s.s.lastOK.IsZero() {
		s.s.maxGap = max(s.s.maxGap, now.Sub(s.s.lastOK))
	}
	s.s.lastOK = now
	return nil
}

// resetGap starts measuring maxGap afresh.
func (s *chaosSender) resetGap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.s.maxGap = 0
}

func (s *chaosSender) stats() sendStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s
}

// idSet is a concurrent set of event IDs that also counts additions and the highest
// attempt added.
type idSet struct {
	mu         sync.Mutex
	m          map[uuid.UUID]bool
	n          int
	maxAttempt int
}

func (s *idSet) add(id uuid.UUID, attempt int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[uuid.UUID]bool{}
	}
	s.m[id] = true
	s.n++
	s.maxAttempt = max(s.maxAttempt, attempt)
}

func (s *idSet) highestAttempt() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxAttempt
}

func (s *idSet) has(id uuid.UUID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

func (s *idSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

func (s *idSet) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// logCounter is a slog.Handler that counts records by message and keeps the last "err" of
// each, for the test's report.
type logCounter struct {
	mu      sync.Mutex
	counts  map[string]int
	lastErr map[string]string
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := r.Message
	if strings.HasPrefix(msg, relayDatabaseDown) { // "…; pausing …, probing again in 200ms"
		msg = relayDatabaseDown
	}
	l.counts[msg]++
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" || a.Key == "reason" {
			err := a.Value.String()
			key := msg
			if msg == relayDatabaseDown { // counted by phase too: the claim or the write-back
				switch {
				case strings.Contains(err, "claiming messages"):
					key += " (claim)"
				case strings.Contains(err, "writing back"):
					key += " (write-back)"
				}
				if key != msg {
					l.counts[key]++
				}
			}
			l.lastErr[key] = err
		}
		return true
	})
	return nil
}

func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

func (l *logCounter) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[msg]
}

func (l *logCounter) samples() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.lastErr))
	for k, v := range l.lastErr {
		out[k] = fmt.Sprintf("%s (logged %d times)", v, l.counts[k])
	}
	return out
}

// natsServer is a private nats-server process with JetStream on file storage, for tests
// that kill the broker: Kill SIGKILLs it, Start starts it again on the same port and store
// directory. It is SIGKILLed at cleanup.
type natsServer struct{ *outboxtest.Process }

// startNATSServer starts a private server on a free port with a store directory of its
// own (extra: more command-line arguments, a cluster node's), killed at cleanup.
func startNATSServer(t testing.TB, extra ...string) *natsServer {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr != nil {
			outboxtest.RequireService(t, "the nats-server binary", err)
		}
		bin = "/usr/sbin/nats-server"
	}
	store := filepath.Join(t.TempDir(), "store")
	return &natsServer{outboxtest.StartProcess(t, "nats-server", 10*time.Second, func(port int) *exec.Cmd {
		return exec.Command(bin, append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", store}, extra...)...)
	})}
}

func (s *natsServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.Port) }

// connectPrivate connects to s, reconnecting forever and quickly, closed at cleanup.
func connectPrivate(t testing.TB, s *natsServer, name string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.url(), nats.Name(name), nats.Timeout(time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 10*time.Second, "JetStream on the private server", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
	return nc, js
}
