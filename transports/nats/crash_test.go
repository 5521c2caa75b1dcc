package outboxnats_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

// childConsumerEnv, when set ("schema stream"), makes the test binary the consumer process
// of TestConsumerKilledBetweenCommitAndAck instead of running tests.
const childConsumerEnv = "TXOUTBOX_CHILD_CONSUMER"

// committedLine is what the child prints once the handler's transaction has committed and
// the consumer is about to acknowledge the delivery.
const committedLine = "committed, acking"

// idempotentEffect is the handler both processes run: one effect row per handled event,
// written in the transaction that records the event in the inbox.
func idempotentEffect(o *outboxpgx.Outbox, pool *pgxpool.Pool, schema string) consumer.Handler[orderPlaced] {
	return outboxpgx.Idempotent(o, pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[orderPlaced]) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+schema+".effects (event_id) VALUES ($1)", e.ID)
		return err
	}, nil)
}

// stallingReceiver hands out its deliveries with an Ack that announces itself on stdout
// and then never returns: the process is killed there, after the commit, before the ack.
type stallingReceiver struct{ outbox.Receiver }

func (r stallingReceiver) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	ds, err := r.Receiver.Receive(ctx, limit)
	for i, d := range ds {
		ds[i] = stallingDelivery{d}
	}
	return ds, err
}

type stallingDelivery struct{ outbox.Delivery }

func (stallingDelivery) Ack(context.Context) error {
	fmt.Println(committedLine)
	select {} // wait for SIGKILL
}

// runChildConsumer consumes the stream named in the environment with the idempotent
// handler until it is killed.
func runChildConsumer() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child consumer:", err)
		os.Exit(2)
	}
	schema, stream, _ := strings.Cut(os.Getenv(childConsumerEnv), " ")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgxtest.URL())
	if err != nil {
		fail(err)
	}
	o, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		fail(err)
	}
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		fail(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		fail(err)
	}
	jc, err := js.Consumer(ctx, stream, stream) // Provision names the consumer after the stream
	if err != nil {
		fail(err)
	}
	r, err := outboxnats.NewReceiver(jc, nil)
	if err != nil {
		fail(err)
	}
	dead, err := o.NewDeadLetters(pool)
	if err != nil {
		fail(err)
	}
	c, err := consumer.New(stallingReceiver{r}, &consumer.Config{Name: "crash", DeadLetters: dead})
	if err != nil {
		fail(err)
	}
	consumer.Handle(c, idempotentEffect(o, pool, schema))
	_ = c.Run(ctx)
	os.Exit(0)
}

// countingReceiver counts the deliveries handed to the consumer that the broker marks as
// redeliveries (attempt 2 or more).
type countingReceiver struct {
	outbox.Receiver
	mu          sync.Mutex
	redelivered int
}

func (r *countingReceiver) Receive(ctx context.Context, limit int) ([]outbox.Delivery, error) {
	ds, err := r.Receiver.Receive(ctx, limit)
	r.mu.Lock()
	for _, d := range ds {
		if d.Attempt() >= 2 {
			r.redelivered++
		}
	}
	r.mu.Unlock()
	return ds, err
}

func (r *countingReceiver) redeliveries() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.redelivered
}

// TestConsumerKilledBetweenCommitAndAck is the real crash behind the in-process
// ExerciseIdempotency case: a consumer process commits the handler's effect and its inbox
// row, is SIGKILLed before it acknowledges the delivery, and JetStream redelivers the event
// to a new consumer, whose inbox absorbs it. The effect happens exactly once, and the
// redelivery is acknowledged rather than retried forever.
func TestConsumerKilledBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	p := pgxtest.New(t, "outboxnats")
	ctx := context.Background()
	if _, err := p.Pool.Exec(ctx, "CREATE TABLE "+p.Schema+".effects (n bigserial, event_id uuid NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const ackWait = time.Second // how soon JetStream redelivers what the dead child held
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage, AckWait: ackWait}, outboxnats.SenderConfig{})
	e := outbox.New(orderPlaced{OrderID: "o-1"}, outbox.WithKey("o-1"))
	m, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.sender.Send(ctx, []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	info, err := d.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe)
	child.Env = append(os.Environ(), childConsumerEnv+"="+p.Schema+" "+info.Config.Name)
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	acking := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == committedLine {
				acking <- true
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
		acking <- false // the child exited without handling the event
	}()
	select {
	case ok := <-acking:
		if !ok {
			t.Fatal("the child consumer exited before it handled the event (its stderr is above)")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("timed out after 30s waiting for the child to handle the event")
	}
	if err := child.Process.Kill(); err != nil { // SIGKILL: the ack is never sent
		t.Fatal(err)
	}
	_ = child.Wait()
	if n := p.Count(t, "effects"); n != 1 {
		t.Fatalf("after the child committed, %d effect rows; want 1", n)
	}
	if ci, err := d.consumer.Info(ctx); err != nil || ci.AckFloor.Consumer != 0 {
		t.Fatalf("the broker saw an ack from the killed child (ack floor %+v, %v)", ci.AckFloor, err)
	}

	received := &countingReceiver{Receiver: d.receiver}
	c, err := consumer.New(received, &consumer.Config{
		Name: "crash", DeadLetters: p.DeadLetters(t),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, idempotentEffect(p.Outbox, p.Pool, p.Schema))
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	outboxtest.WaitFor(t, 30*time.Second, "the redelivery to be handled and acknowledged", func() bool {
		ci, err := d.consumer.Info(ctx)
		return err == nil && received.redeliveries() >= 1 && ci.AckFloor.Stream == 1 && ci.NumAckPending == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := p.Count(t, "effects"); n != 1 {
		t.Fatalf("after the redelivery, %d effect rows; want exactly 1", n)
	}
	if n := p.Count(t, "outbox_inbox"); n != 1 {
		t.Errorf("%d inbox rows; want 1", n)
	}
}
