package outboxnats_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// TestChaosStreamLeaderKilled runs the chaos pipeline (producers, two relays, a consumer
// handling through the inbox) against JetStream as it is run at scale: a cluster of three
// nats-servers on loopback and a stream of three replicas. Mid-run it SIGKILLs the server
// that leads the stream; the others elect a new leader while producers keep committing,
// then the killed server comes back. The relays and the consumer run with MaxAttempts 3,
// so a failure that spent attempts would dead-letter events. Then: 0 committed events
// lost, 0 duplicate effects, 0 rolled-back events handled, nothing dead-lettered, per-key
// order in the stream; reported: how long the relays paused.
func TestChaosStreamLeaderKilled(t *testing.T) {
	t.Parallel()
	outboxtest.SkipIfShort(t, "a three-node NATS cluster")
	p := pgxtest.New(t, "outboxnats")
	cluster := startNATSCluster(t, 3)
	_, jsRelay := connectCluster(t, cluster, "cluster relays")
	_, jsCons := connectCluster(t, cluster, "cluster consumer")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "CLUSTER"
	var (
		stream jetstream.Stream
		err    error
	)
	// Until the cluster's meta leader is elected, creating a stream fails.
	outboxtest.WaitFor(t, 30*time.Second, "an R3 stream to be created", func() bool {
		stream, err = jsRelay.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: name, Subjects: []string{"cluster.>"}, Replicas: 3, Duplicates: 2 * time.Minute,
		})
		return err == nil
	})
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second,
		MaxDeliver: -1, MaxAckPending: 1000, Replicas: 3,
	}); err != nil {
		t.Fatal(err)
	}
	sender, err := outboxnats.NewSender(jsRelay, &outboxnats.SenderConfig{SubjectPrefix: "cluster", Stream: name})
	if err != nil {
		t.Fatal(err)
	}
	jc, err := jsCons.Consumer(ctx, name, name)
	if err != nil {
		t.Fatal(err)
	}
	receiver, err := outboxnats.NewReceiver(jc, &outboxnats.ReceiverConfig{MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}

	app := "txoutbox_cluster_" + unique()
	pl := newChaosPipeline(t, p, chaosSetup{
		relayPool:    chaosPool(t, app, 4),
		consumerPool: chaosPool(t, app, 12),
		stream:       stream,
		sender:       sender,
		receiver:     receiver,
		maxAttempts:  3,
	})
	var outages outageLog
	pl.onStateChange = outages.record
	pl.start()
	production, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	producing := pl.produce(production, 4)

	outboxtest.WaitFor(t, 30*time.Second, "300 events to be handled before the kill", func() bool {
		return pl.handled.len() >= 300
	})
	info, err := stream.Info(ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("stream info: %+v, %v; want a leader", info, err)
	}
	leader := cluster.byName(info.Cluster.Leader)
	pl.sender.resetGap()
	killedAt := time.Now()
	leader.Kill()
	// A new leader, seen through the survivors.
	var newLeader string
	outboxtest.WaitFor(t, 30*time.Second, "a new stream leader", func() bool {
		ictx, icancel := context.WithTimeout(context.Background(), time.Second)
		defer icancel()
		i, err := stream.Info(ictx)
		if err != nil || i.Cluster == nil {
			return false
		}
		newLeader = i.Cluster.Leader
		return newLeader != "" && newLeader != info.Cluster.Leader
	})
	electedAfter := time.Since(killedAt)
	handledAtElection := pl.handled.len()
	outboxtest.WaitFor(t, 30*time.Second, "events to be handled after the election", func() bool {
		return pl.handled.len() >= handledAtElection+200
	})
	leader.Start() // the killed server rejoins and catches up
	time.Sleep(500 * time.Millisecond)
	stopProducing()
	producing.Wait()
	producedUntil := time.Now()

	pl.awaitSettled(90 * time.Second)
	t.Logf("stream leader %s SIGKILLed; %s elected %v later; settled %v after production ended",
		info.Cluster.Leader, newLeader, electedAfter.Round(time.Millisecond), time.Since(producedUntil).Round(time.Millisecond))
	st := pl.sender.stats()
	t.Logf("relays paused: longest gap between successful sends after the kill %v; broker reported unavailable %s",
		st.maxGap.Round(time.Millisecond), outages.String())
	pl.stop()
	res := pl.verify()
	pl.logStats(res)
	if res.streamDuplicates != 0 {
		t.Logf("duplicates stored by the stream itself: %d", res.streamDuplicates)
	}
}

// outageLog records the relays' broker outages from OnStateChange.
type outageLog struct {
	mu    sync.Mutex
	since map[string]time.Time // relay → unavailable since, while it is
	spans []time.Duration
}

func (o *outageLog) record(relay string, s relay.State) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since == nil {
		o.since = map[string]time.Time{}
	}
	switch {
	case !s.BrokerUnavailableSince.IsZero():
		o.since[relay] = s.BrokerUnavailableSince
	case !o.since[relay].IsZero():
		o.spans = append(o.spans, time.Since(o.since[relay]))
		delete(o.since, relay)
	}
}

func (o *outageLog) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.spans) == 0 {
		return "never"
	}
	parts := make([]string, len(o.spans))
	for i, d := range o.spans {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%d times (%s)", len(o.spans), strings.Join(parts, ", "))
}

// natsCluster is private nats-servers routed into one JetStream cluster.
type natsCluster []*natsServer

// startNATSCluster starts n servers named node-0… that route to each other.
func startNATSCluster(t *testing.T, n int) natsCluster {
	t.Helper()
	routes := make([]string, n)
	for i := range routes {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", outboxtest.FreePort(t))
	}
	c := make(natsCluster, n)
	for i := range c {
		c[i] = startNATSServer(t, "-n", fmt.Sprintf("node-%d", i), "--cluster_name", "txoutbox",
			"--cluster", routes[i], "--routes", strings.Join(routes, ","))
	}
	return c
}

func (c natsCluster) byName(name string) *natsServer {
	for i, s := range c {
		if name == fmt.Sprintf("node-%d", i) {
			return s
		}
	}
	panic("no cluster node named " + name)
}

// connectCluster connects to every node of c, reconnecting forever and quickly, and waits
// until JetStream answers.
func connectCluster(t *testing.T, c natsCluster, name string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	urls := make([]string, len(c))
	for i, s := range c {
		urls[i] = s.url()
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Name(name), nats.Timeout(time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, 30*time.Second, "JetStream on the cluster", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
	return nc, js
}
