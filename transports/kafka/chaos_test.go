package outboxkafka_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txoutbox/outbox/outboxtest"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
)

// restartableCluster is a kfake cluster that keeps its data on disk and its ports, so it
// can be killed and started again, as a broker restart.
type restartableCluster struct {
	t     *testing.T
	dir   string
	ports []int
	mu    sync.Mutex
	c     *kfake.Cluster
}

func newRestartableCluster(t *testing.T) *restartableCluster {
	rc := &restartableCluster{t: t, dir: t.TempDir()}
	for range brokers {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		rc.ports = append(rc.ports, l.Addr().(*net.TCPAddr).Port)
		_ = l.Close()
	}
	rc.start()
	t.Cleanup(rc.kill)
	return rc
}

func (rc *restartableCluster) start() {
	c, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.Ports(rc.ports...), kfake.DataDir(rc.dir))
	if err != nil {
		rc.t.Fatal(err)
	}
	rc.mu.Lock()
	rc.c = c
	rc.mu.Unlock()
}

func (rc *restartableCluster) kill() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.c != nil {
		rc.c.Close()
		rc.c = nil
	}
}

func (rc *restartableCluster) addrs() []string {
	var out []string
	for _, p := range rc.ports {
		out = append(out, "127.0.0.1:"+strconv.Itoa(p))
	}
	return out
}

// TestChaosBrokerOutage runs the whole pipeline while producers keep committing orders:
// first the brokers fail requests (produce, fetch, commits, heartbeats) for a while, then
// the whole cluster is killed and restarted from its data directory on the same ports.
// Relay sends time out or fail, records are produced twice, consumer commits are lost and
// the group re-forms; every committed order must still take effect exactly once, each
// customer's orders in commit order.
func TestChaosBrokerOutage(t *testing.T) {
	t.Parallel()
	rc := newRestartableCluster(t)
	d := &destination{}
	d.client = newClientAddrs(t, rc.addrs())
	d.topic = createTopic(t, d.client, nil)
	var err error
	if d.sender, err = outboxkafka.NewSender(d.client, &outboxkafka.SenderConfig{Topic: d.topic}); err != nil {
		t.Fatal(err)
	}
	group := "billing-" + d.topic
	newRecv := func() *outboxkafka.Receiver {
		r, err := outboxkafka.NewReceiver(&outboxkafka.ReceiverConfig{Group: group, Topics: []string{d.topic}, MaxWait: 200 * time.Millisecond, Logger: quiet()},
			seeds(rc.addrs())...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() }) // a commit may fail against a dead cluster
		return r
	}
	pl := newPipeline(t)
	stops := []func(){
		run(t, pl.relay("relay-1", d.sender).Run), run(t, pl.relay("relay-2", d.sender).Run),
		run(t, pl.consumer(newRecv()).Run), run(t, pl.consumer(newRecv()).Run),
	}

	// Four producers, each with its own customers, commit an order per customer every 20ms.
	production, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	var producers sync.WaitGroup
	for prod := range 4 {
		producers.Go(func() {
			for i := 0; production.Err() == nil; i++ {
				var customers []string
				for k := range 1 + i%4 {
					customers = append(customers, fmt.Sprintf("customer-%d-%d", prod, (i+k)%5))
				}
				pl.commit(customers...)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	effects := func() int { _, n := pl.effects(); return n }
	outboxtest.WaitFor(t, 30*time.Second, "300 orders to take effect before the faults", func() bool { return effects() >= 300 })

	// Phase 1: every broker fails every produce, fetch, commit and heartbeat for 1.5s.
	rc.mu.Lock()
	h := rc.c.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce, kmsg.Fetch, kmsg.OffsetCommit, kmsg.Heartbeat},
		Err:   kerr.NotLeaderForPartition,
		Count: -1,
	})
	rc.mu.Unlock()
	time.Sleep(1500 * time.Millisecond)
	hits := h.Hits()
	h.Remove()
	if hits == 0 {
		t.Fatal("the faults hit no request")
	}
	outboxtest.WaitFor(t, 30*time.Second, "orders to take effect again after the faults", func() bool { return effects() >= 600 })

	// Phase 2: the cluster dies for 1.5s and comes back from its disk.
	before := effects()
	rc.kill()
	time.Sleep(1500 * time.Millisecond)
	pending := pl.p.Count(t, "outbox")
	rc.start()
	outboxtest.WaitFor(t, 60*time.Second, "orders to take effect after the restart", func() bool { return effects() > before+300 })
	stopProducing()
	producers.Wait()

	pl.awaitSettled(90 * time.Second)
	for _, stop := range stops {
		stop()
	}
	t.Logf("faults hit %d requests; %d orders waited in the outbox when the cluster came back", hits, pending)
	pl.verify()
}
