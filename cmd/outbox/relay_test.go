package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/outboxtest"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// Shipped is routed to a destination of its own in the relay tests.
type Shipped struct {
	Order int `json:"order"`
}

func (Shipped) EventType() string { return "orders.shipped" }

// daemon is the command running as a subprocess.
type daemon struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs strings.Builder
	done chan error
}

// startDaemon runs the built binary with args and extra environment, collecting stderr.
func startDaemon(t *testing.T, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(binary(t), args...), done: make(chan error, 1)}
	d.cmd.Env = append(os.Environ(), env...)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stdout = io.Discard
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.logs.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
		}
		d.done <- d.cmd.Wait()
	}()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

func (d *daemon) stderr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

var servingRe = regexp.MustCompile(`addr=http://(127\.0\.0\.1:\d+)`)

// addr waits for the daemon's health and metrics address.
func (d *daemon) addr(t *testing.T) string {
	t.Helper()
	var addr string
	outboxtest.WaitFor(t, deadline, "the daemon to serve", func() bool {
		if m := servingRe.FindStringSubmatch(d.stderr()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

// stop sends SIGTERM and returns the exit code.
func (d *daemon) stop(t *testing.T) int {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(deadline):
		t.Fatalf("no exit %v after SIGTERM:\n%s", deadline, d.stderr())
	}
	return d.cmd.ProcessState.ExitCode()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// broker is one transport under test: the relay's --transport and --route values, the
// environment it needs, and how to read back what was delivered.
type broker struct {
	url     string
	routes  []string
	env     []string
	collect func(ctx context.Context) ([]outbox.Message, error) // one poll of every destination
}

// TestRelayDelivers: "outbox relay", run as a subprocess, delivers every event to each
// broker, routed types to their own destination; it answers /healthz and exports the
// relay's metrics on /metrics; on SIGTERM it exits 0 and no lease is left held.
func TestRelayDelivers(t *testing.T) {
	for name, setup := range map[string]func(t *testing.T) broker{
		"sqs":      func(t *testing.T) broker { return sqsBroker(t, false) },
		"sqs-fifo": func(t *testing.T) broker { return sqsBroker(t, true) },
		"azqueue":  azureBroker,
		"nats":     natsBroker,
		"kafka":    kafkaBroker,
		"rabbitmq": rabbitBroker,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tb := newTestDB(t, "postgres", outboxsql.Postgres, "pgx")
			tb.migrate(t)
			want := map[uuid.UUID]string{}
			var events []outbox.Encodable
			for i := range 4 {
				e := outbox.New(Placed{Order: i}, outbox.WithKey(fmt.Sprint("order-", i%2)))
				events, want[e.ID] = append(events, e), "orders.placed"
			}
			for i := range 2 {
				e := outbox.New(Shipped{Order: i})
				events, want[e.ID] = append(events, e), "orders.shipped"
			}
			tb.publish(t, events...)

			args := append([]string{"relay"}, tb.flags...)
			args = append(args, "--transport", b.url, "--listen", "127.0.0.1:0", "--name", "cli-test-"+name)
			for _, r := range b.routes {
				args = append(args, "--route", r)
			}
			d := startDaemon(t, b.env, args...)
			addr := d.addr(t)
			if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || body != "ok\n" {
				t.Fatalf("/healthz: %d %q", code, body)
			}

			got := map[uuid.UUID]int{}
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			for len(got) < len(want) {
				msgs, err := b.collect(ctx)
				if err != nil {
					t.Fatalf("receiving (got %d of %d): %v\nrelay log:\n%s", len(got), len(want), err, d.stderr())
				}
				for _, m := range msgs {
					if want[m.ID] != m.Type {
						t.Fatalf("received %s %s, not one published (or at the wrong destination)", m.Type, m.ID)
					}
					got[m.ID]++
				}
			}
			for id, n := range got {
				if n != 1 {
					t.Errorf("event %s received %d times", id, n)
				}
			}
			outboxtest.WaitFor(t, deadline, "the outbox to drain", func() bool { return tb.scalar(t, "SELECT count(*) FROM "+tb.table("")) == 0 })
			_, metrics := get(t, "http://"+addr+"/metrics")
			for _, m := range []string{"messaging_client_sent_messages_total{", "txoutbox_outbox_backlog{", "txoutbox_relay_batch_size"} {
				if !strings.Contains(metrics, m) {
					t.Errorf("/metrics lacks %s:\n%s", m, cut(metrics, 3000))
				}
			}

			if code := d.stop(t); code != 0 {
				t.Fatalf("exit %d after SIGTERM:\n%s", code, d.stderr())
			}
			if !strings.Contains(d.stderr(), "relay stopped") {
				t.Errorf("no clean stop in the log:\n%s", d.stderr())
			}
			if held := tb.scalar(t, "SELECT count(*) FROM "+tb.table("")+" WHERE lease_until > now()"); held != 0 {
				t.Errorf("%d leases held after the relay stopped", held)
			}
			for _, secret := range []string{"s3cretPW", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq"} {
				if strings.Contains(d.stderr(), secret) {
					t.Errorf("the log holds a secret:\n%s", d.stderr())
				}
			}
		})
	}
}

// TestRelayStopsOnSIGTERM: on every database, a relay stopped while it drains a large
// backlog exits 0, holds no lease afterwards, and has sent each event at most once: every
// event is either delivered or still in the outbox.
func TestRelayStopsOnSIGTERM(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		tb.migrate(t)
		const n = 3000
		ids := map[string]bool{}
		var events []outbox.Encodable
		for i := range n {
			e := outbox.New(Placed{Order: i})
			ids[e.ID.String()] = true
			events = append(events, e)
		}
		tb.publish(t, events...)
		d := startDaemon(t, nil, append(append([]string{"relay"}, tb.flags...),
			"--transport", "memory://", "--listen", "", "--batch-size", "50", "--concurrency", "2")...)
		delivered := regexp.MustCompile(`msg=delivered event_id=(\S+)`)
		outboxtest.WaitFor(t, deadline, "some deliveries", func() bool { return len(delivered.FindAllString(d.stderr(), 200)) >= 100 })
		if code := d.stop(t); code != 0 {
			t.Fatalf("exit %d after SIGTERM:\n%s", code, cut(d.stderr(), 3000))
		}
		now := map[string]string{"postgres": "now()", "mysql": "UTC_TIMESTAMP(6)", "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')"}[tb.Dialect]
		if held := tb.scalar(t, "SELECT count(*) FROM "+tb.table("")+" WHERE lease_until > "+now); held != 0 {
			t.Fatalf("%d leases held after the relay stopped; log:\n%s", held, grepLines(d.stderr(), "level=(WARN|ERROR)"))
		}
		sent := map[string]int{}
		for _, m := range delivered.FindAllStringSubmatch(d.stderr(), -1) {
			sent[m[1]]++
			if sent[m[1]] > 1 || !ids[m[1]] {
				t.Fatalf("event %s sent %d times (published: %v)", m[1], sent[m[1]], ids[m[1]])
			}
		}
		left := tb.scalar(t, "SELECT count(*) FROM "+tb.table(""))
		if int(left)+len(sent) != n {
			t.Fatalf("%d delivered + %d left in the outbox = %d, want %d", len(sent), left, int(left)+len(sent), n)
		}
		t.Logf("%s: stopped after %d of %d events", tb.Dialect, len(sent), n)
	})
}

// sqsBroker makes two queues on the SQS emulator (FIFO ones when fifo).
func sqsBroker(t *testing.T, fifo bool) broker {
	endpoint := outboxtest.SQSEndpoint()
	client := sqs.New(sqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
	ctx := context.Background()
	_, err := client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)})
	outboxtest.RequireService(t, "SQS emulator at "+endpoint, err)
	var urls []string
	var names []string
	for range 2 {
		name := randomName("cli-")
		attrs := map[string]string{}
		if fifo {
			name += ".fifo"
			attrs[string(sqstypes.QueueAttributeNameFifoQueue)] = "true"
		}
		out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
		if err != nil {
			t.Fatal(err)
		}
		urls, names = append(urls, aws.ToString(out.QueueUrl)), append(names, name)
		t.Cleanup(func() { _, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
	}
	var receivers []*outboxsqs.Receiver
	for _, u := range urls {
		r, err := outboxsqs.NewReceiver(client, &outboxsqs.ReceiverConfig{QueueURL: u, WaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		receivers = append(receivers, r)
	}
	return broker{
		url:    "sqs://" + names[0] + "?region=us-east-1&endpoint=" + endpoint,
		routes: []string{"orders.shipped=" + names[1]},
		env:    []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=s3cretPW", "AWS_REGION=eu-west-1"},
		collect: func(ctx context.Context) ([]outbox.Message, error) {
			return receiveAll(ctx, receivers[0], receivers[1])
		},
	}
}

// receiveAll does one Receive on each receiver, acks what came and returns it.
func receiveAll(ctx context.Context, rs ...outbox.Receiver) ([]outbox.Message, error) {
	var out []outbox.Message
	for _, r := range rs {
		ds, err := r.Receive(ctx, 10)
		if err != nil {
			return out, err
		}
		for _, d := range ds {
			m, err := d.Message()
			if err != nil {
				return out, err
			}
			if err := d.Ack(ctx); err != nil {
				return out, err
			}
			out = append(out, m)
		}
	}
	return out, nil
}

func azureBroker(t *testing.T) broker {
	conn := outboxtest.AzuriteConnString()
	client, err := azqueue.NewServiceClientFromConnectionString(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := []string{randomName("cli-"), randomName("cli-")}
	var receivers []outbox.Receiver
	for _, name := range names {
		_, err := client.CreateQueue(ctx, name, nil)
		outboxtest.RequireService(t, "Azurite", err)
		t.Cleanup(func() { _, _ = client.DeleteQueue(context.Background(), name, nil) })
		r, err := outboxazqueue.NewReceiver(client.NewQueueClient(name), &outboxazqueue.ReceiverConfig{WaitTime: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		receivers = append(receivers, r)
	}
	return broker{
		url:     "azqueue://" + names[0],
		routes:  []string{"orders.shipped=" + names[1]},
		env:     []string{"AZURE_STORAGE_CONNECTION_STRING=" + conn},
		collect: func(ctx context.Context) ([]outbox.Message, error) { return receiveAll(ctx, receivers...) },
	}
}

func natsBroker(t *testing.T) broker {
	url := outboxtest.NATSURL()
	nc, err := nats.Connect(url)
	outboxtest.RequireService(t, "NATS", err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prefix := randomName("cli")
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: strings.ToUpper(prefix), Subjects: []string{prefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), strings.ToUpper(prefix)) })
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "cli", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outboxnats.NewReceiver(cons, &outboxnats.ReceiverConfig{MaxWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return broker{
		url:     url + "?subject-prefix=" + prefix + "&stream=" + strings.ToUpper(prefix),
		routes:  []string{"orders.shipped=" + prefix + ".shipping"},
		collect: func(ctx context.Context) ([]outbox.Message, error) { return receiveAll(ctx, r) },
	}
}

func kafkaBroker(t *testing.T) broker {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	seeds := kgo.SeedBrokers(cluster.ListenAddrs()...)
	admin, err := kgo.NewClient(seeds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := kadm.NewClient(admin).CreateTopics(context.Background(), 2, -1, nil, "placed", "shipped"); err != nil {
		t.Fatal(err)
	}
	r, err := outboxkafka.NewReceiver(&outboxkafka.ReceiverConfig{Group: "cli", Topics: []string{"placed", "shipped"}, MaxWait: 200 * time.Millisecond}, seeds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return broker{
		url:     "kafka://" + strings.Join(cluster.ListenAddrs(), ",") + "?topic=placed",
		routes:  []string{"orders.shipped=shipped"},
		collect: func(ctx context.Context) ([]outbox.Message, error) { return receiveAll(ctx, r) },
	}
}

func rabbitBroker(t *testing.T) broker {
	url := outboxtest.AMQPURL()
	conn, err := amqp.Dial(url)
	outboxtest.RequireService(t, "RabbitMQ", err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	exchange, queue := randomName("cli-x-"), randomName("cli-q-")
	if err := outboxrabbitmq.Declare(ch, outboxrabbitmq.Topology{Exchange: exchange, Queue: queue}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	r, err := outboxrabbitmq.NewReceiver(outboxrabbitmq.Connection{URL: url}, &outboxrabbitmq.ReceiverConfig{Queue: queue, MaxWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return broker{
		url:     url + "?exchange=" + exchange,
		routes:  []string{"orders.shipped=shipping.v1"},
		collect: func(ctx context.Context) ([]outbox.Message, error) { return receiveAll(ctx, r) },
	}
}

// grepLines returns the lines of s that match pattern.
func grepLines(s, pattern string) string {
	re := regexp.MustCompile(pattern)
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if re.MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
