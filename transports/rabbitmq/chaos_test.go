package outboxrabbitmq_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/outbox/relay"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// TestChaosBrokerKilled runs two pipelines — producers committing (and rolling back)
// events through outboxpgx, two relays, RabbitMQ, a consumer whose handler writes one
// effect row per event through outboxpgx.Idempotent — against a private RabbitMQ node,
// SIGKILLs the node mid-run, keeps it down for a second and a half while producers keep
// committing, and restarts it on the same ports and data directory. Sends lose their
// confirms, acks are lost, consumers lose their channels; the clients redial. Then:
// 0 committed events lost, 0 duplicate effects, 0 rolled-back events handled, nothing
// dead-lettered; and on the ordered queue, per-key order of handling.
//   - "standard": a quorum queue, retries through retry queues;
//   - "ordered": a single-active-consumer classic queue and an ordered receiver.
func TestChaosBrokerKilled(t *testing.T) {
	t.Parallel()
	node := startRabbitMQ(t)
	pipelines := []*chaosPipeline{
		newChaosPipeline(t, node.url(), false),
		newChaosPipeline(t, node.url(), true),
	}
	production, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	for _, pl := range pipelines {
		pl.start(production)
	}
	outboxtest.WaitFor(t, 60*time.Second, "200 events handled by each pipeline before the outage", func() bool {
		return pipelines[0].handledCount() >= 200 && pipelines[1].handledCount() >= 200
	})
	failedBefore := pipelines[0].failedSends.Load()
	const outage = 1500 * time.Millisecond
	killedAt := time.Now()
	node.Kill()
	outboxtest.WaitFor(t, 10*time.Second, "a relay send to fail while the broker is down", func() bool {
		return pipelines[0].failedSends.Load() > failedBefore
	})
	time.Sleep(time.Until(killedAt.Add(outage))) // the outage lasts this long, whatever happens meanwhile
	node.Start()
	restartedAt := time.Now()
	time.Sleep(500 * time.Millisecond) // new events follow the backlog
	stopProducing()
	for _, pl := range pipelines {
		pl.producing.Wait()
	}
	for _, pl := range pipelines {
		pl.awaitSettled(90 * time.Second)
	}
	t.Logf("broker down for %v; settled %v after the restart", restartedAt.Sub(killedAt).Round(time.Millisecond), time.Since(restartedAt).Round(time.Millisecond))
	for _, pl := range pipelines {
		pl.stop()
		pl.verify()
	}
}

// chaosPipeline is producers → outbox → two relays → RabbitMQ → consumer → effects.
type chaosPipeline struct {
	t           *testing.T
	name        string
	ordered     bool
	p           *pgxtest.Outbox
	d           *destination
	failedSends atomic.Int64
	producing   sync.WaitGroup
	stop        func()

	mu         sync.Mutex
	published  []outbox.Encodable // committed, in commit order
	committed  map[uuid.UUID]bool
	rolledBack map[uuid.UUID]bool
	handled    []outbox.Message // successful handlings, in order
	calls      int
	maxAttempt int
}

func newChaosPipeline(t *testing.T, url string, ordered bool) *chaosPipeline {
	t.Helper()
	name := "standard"
	if ordered {
		name = "ordered"
	}
	pl := &chaosPipeline{t: t, name: name, ordered: ordered, p: pgxtest.New(t, "outboxrabbitmq"),
		committed: map[uuid.UUID]bool{}, rolledBack: map[uuid.UUID]bool{}}
	pl.d = newDestinationAt(t, url, outboxrabbitmq.Topology{Ordered: ordered}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{MaxWait: 500 * time.Millisecond})
	if _, err := pl.p.Pool.Exec(context.Background(), "CREATE TABLE "+pl.p.Schema+".effects (n bigserial, event_id uuid NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return pl
}

type countingFailures struct {
	outbox.Sender
	failed *atomic.Int64
}

func (s countingFailures) Send(ctx context.Context, msgs []outbox.Message) error {
	err := s.Sender.Send(ctx, msgs)
	if err != nil {
		s.failed.Add(1)
	}
	return err
}

// start runs two relays, the consumer, and two producers until production ends.
func (pl *chaosPipeline) start(production context.Context) {
	t := pl.t
	var relays []*relay.Relay
	for i := range 2 {
		r, err := relay.New(pl.p.Store(t), countingFailures{pl.d.sender, &pl.failedSends}, &relay.Config{
			Name: fmt.Sprintf("chaos-%s-%d", pl.name, i), BatchSize: 100, Lease: 2 * time.Second,
			// The outage spends no attempt (the sender marks its failures outbox.Unavailable
			// and the relay pauses), so the default MaxAttempts holds even with retries 10×
			// faster than the default.
			RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: time.Second, Logger: quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	c, err := consumer.New(pl.d.receiver, &consumer.Config{
		Name: "chaos", DeadLetters: pl.p.DeadLetters(t),
		RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: time.Second, MaxAttempts: 100, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	effect := outboxpgx.Idempotent(pl.p.Outbox, pl.p.Pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[orderPlaced]) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+pl.p.Schema+".effects (event_id) VALUES ($1)", e.ID)
		return err
	}, nil)
	consumer.Handle(c, func(ctx context.Context, e outbox.Event[orderPlaced]) error {
		info, _ := consumer.InfoFrom(ctx)
		pl.mu.Lock()
		pl.calls++
		pl.maxAttempt = max(pl.maxAttempt, info.Attempt)
		pl.mu.Unlock()
		if err := effect(ctx, e); err != nil {
			return err
		}
		m, _ := e.Encode()
		pl.mu.Lock()
		pl.handled = append(pl.handled, m)
		pl.mu.Unlock()
		return nil
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
	t.Cleanup(pl.stop)

	for prod := range 2 {
		pl.producing.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(prod), uint64(time.Now().UnixNano())))
			for i := 0; production.Err() == nil; i++ {
				events := make([]outbox.Encodable, 1+rng.IntN(8))
				for j := range events {
					key := ""
					if rng.IntN(4) > 0 {
						key = fmt.Sprintf("p%d-k%d", prod, rng.IntN(8))
					}
					events[j] = outbox.New(orderPlaced{OrderID: fmt.Sprintf("p%d-t%d-e%d", prod, i, j)}, outbox.WithKey(key))
				}
				commit := i%5 != 4
				if err := pl.publishTx(events, commit); err != nil {
					t.Errorf("producer %d: %v", prod, err)
					return
				}
				time.Sleep(40 * time.Millisecond)
			}
		})
	}
	t.Cleanup(pl.producing.Wait)
}

// publishTx publishes events in one transaction and commits or rolls it back. The
// producers hold the lock over the transaction, so commit order is the recorded order.
func (pl *chaosPipeline) publishTx(events []outbox.Encodable, commit bool) error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	ctx := context.Background()
	tx, err := pl.p.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if err := pl.p.Outbox.Publish(ctx, tx, events...); err != nil {
		return err
	}
	into := pl.rolledBack
	if commit {
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		into = pl.committed
		pl.published = append(pl.published, events...)
	}
	for _, e := range events {
		m, _ := e.Encode()
		into[m.ID] = true
	}
	return nil
}

func (pl *chaosPipeline) handledCount() int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return len(pl.handled)
}

// awaitSettled waits until the outbox is empty and every committed event has its effect
// or a dead letter (which verify then reports).
func (pl *chaosPipeline) awaitSettled(timeout time.Duration) {
	pl.t.Helper()
	pl.mu.Lock()
	want := len(pl.committed)
	pl.mu.Unlock()
	s := pl.p.Schema
	outboxtest.WaitFor(pl.t, timeout, fmt.Sprintf("%s: the outbox to drain and the %d committed events to take effect", pl.name, want), func() bool {
		var pending, effects, dead int
		err := pl.p.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+s+`.outbox),
			(SELECT count(DISTINCT event_id) FROM `+s+`.effects), (SELECT count(*) FROM `+s+`.outbox_dead_letters)`).Scan(&pending, &effects, &dead)
		if err != nil {
			pl.t.Fatal(err)
		}
		return pending == 0 && effects+dead >= want
	})
}

// verify checks the end state, with the relays and the consumer stopped.
func (pl *chaosPipeline) verify() {
	t := pl.t
	t.Helper()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if len(pl.committed) < 300 || len(pl.rolledBack) == 0 {
		t.Errorf("%s: only %d committed and %d rolled-back events: too few to prove anything", pl.name, len(pl.committed), len(pl.rolledBack))
	}
	if n := pl.p.Count(t, "outbox_dead_letters"); n != 0 {
		t.Errorf("%s: %d dead letters; want none", pl.name, n)
	}
	effects := map[uuid.UUID]int{}
	rows, err := pl.p.Pool.Query(context.Background(), "SELECT event_id FROM "+pl.p.Schema+".effects")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		effects[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var lost, dup, rolledBack, phantom int
	for id := range pl.committed {
		if effects[id] == 0 {
			lost++
		}
	}
	for id, n := range effects {
		if n > 1 {
			dup++
		}
		if pl.rolledBack[id] {
			rolledBack++
		} else if !pl.committed[id] {
			phantom++
		}
	}
	if lost+dup+rolledBack+phantom > 0 {
		t.Errorf("%s: %d committed events lost, %d with duplicate effects, %d rolled-back events with an effect, %d unknown",
			pl.name, lost, dup, rolledBack, phantom)
	}
	if pl.ordered {
		outboxtest.CheckPerKeyOrder(t, pl.published, pl.handled)
	}
	t.Logf("%s: %d committed, %d rolled back; %d handler calls, %d failed sends, highest attempt %d; sender reconnects %d, receiver reconnects %d",
		pl.name, len(pl.committed), len(pl.rolledBack), pl.calls, pl.failedSends.Load(), pl.maxAttempt, pl.d.sender.Reconnects(), pl.d.receiver.Reconnects())
	if pl.d.sender.Reconnects() == 0 || pl.d.receiver.Reconnects() == 0 {
		t.Errorf("%s: the sender reconnected %d times and the receiver %d; want both to have", pl.name, pl.d.sender.Reconnects(), pl.d.receiver.Reconnects())
	}
}

// rabbitNode is a private RabbitMQ node on free ports with its data under a temporary
// directory, for tests that kill the broker (never the shared one): Kill SIGKILLs it, Start
// starts it again on the same ports and data. It is SIGKILLed at cleanup.
type rabbitNode struct{ *outboxtest.Process }

const rabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server" // Debian's rabbitmq-server package

func startRabbitMQ(t *testing.T) *rabbitNode {
	t.Helper()
	if _, err := os.Stat(rabbitServer); err != nil {
		outboxtest.RequireService(t, "the rabbitmq-server package (scripts/services/up.sh installs it)", err)
	}
	dir := t.TempDir()
	distPort := outboxtest.FreePort(t)
	name := "txoutbox-chaos-" + unique() + "@localhost"
	logBase := filepath.Join(dir, "log")
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the node is killed (cleanups run last first)
		if b, err := os.ReadFile(filepath.Join(logBase, name+".log")); err == nil && t.Failed() {
			t.Logf("the node's log (last 3000 bytes):\n%s", b[max(0, len(b)-3000):])
		}
	})
	return &rabbitNode{outboxtest.StartProcess(t, "rabbitmq-server", 60*time.Second, func(port int) *exec.Cmd {
		// The system's rabbitmq.conf names the shared node's listener; this node has its own.
		conf := fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\nloopback_users = none\n", port)
		if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(rabbitServer)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(),
			"HOME="+dir,               // its own Erlang cookie
			"RUNNING_UNDER_SYSTEMD=1", // exec the VM in place of the script, so kill reaches it
			"RABBITMQ_NODENAME="+name,
			"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
			"RABBITMQ_NODE_PORT="+strconv.Itoa(port),
			"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
			"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
			"RABBITMQ_LOG_BASE="+logBase,
			"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
			"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
			"ERL_EPMD_ADDRESS=127.0.0.1",
			"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		)
		return cmd
	})}
}

func (n *rabbitNode) url() string {
	return "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(n.Port) + "/"
}
