package outboxnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

func TestMain(m *testing.M) {
	if os.Getenv(childConsumerEnv) != "" {
		runChildConsumer() // TestConsumerKilledBetweenCommitAndAck re-runs this binary as its consumer
	}
	goleak.VerifyTestMain(m)
}

func natsURL() string {
	if u := os.Getenv("TXOUTBOX_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

func pgURL() string {
	if u := os.Getenv("TXOUTBOX_PG_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// connect opens a NATS connection with JetStream for the test, closed at its end.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(natsURL(), nats.Timeout(2*time.Second), nats.Name(t.Name()))
	if err != nil {
		outboxtest.RequireService(t, "NATS at "+natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		outboxtest.RequireService(t, "JetStream at "+natsURL(), err)
	}
	return nc, js
}

// unique returns a fresh lower-case suffix for stream, subject and schema names.
func unique() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// provision creates t (a fresh, uniquely named stream and consumer), deleted at cleanup.
func provision(t testing.TB, js jetstream.JetStream, top outboxnats.Topology) (jetstream.Stream, jetstream.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, consumer, err := outboxnats.Provision(ctx, js, top)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, top.Stream); err != nil {
			t.Errorf("deleting stream %s: %v", top.Stream, err)
		}
	})
	return stream, consumer
}

// destination is a fresh stream, consumer, sender and receiver for one test.
type destination struct {
	prefix   string
	stream   jetstream.Stream
	consumer jetstream.Consumer
	sender   *outboxnats.Sender
	receiver *outboxnats.Receiver
}

func newDestination(t testing.TB, js jetstream.JetStream, top outboxnats.Topology, cfg outboxnats.SenderConfig) *destination {
	t.Helper()
	id := unique()
	d := &destination{prefix: "outboxtest." + id}
	top.Stream = "OUTBOXTEST_" + id
	top.Subjects = []string{d.prefix + ".>"}
	d.stream, d.consumer = provision(t, js, top)
	cfg.SubjectPrefix = d.prefix
	cfg.Stream = top.Stream
	var err error
	if d.sender, err = outboxnats.NewSender(js, &cfg); err != nil {
		t.Fatal(err)
	}
	if d.receiver, err = outboxnats.NewReceiver(d.consumer, nil); err != nil {
		t.Fatal(err)
	}
	return d
}

// streamMsgs returns how many messages the stream stores now.
func streamMsgs(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// pgOutbox is an outbox in a fresh PostgreSQL schema, dropped at cleanup.
type pgOutbox struct {
	pool   *pgxpool.Pool
	outbox *outboxpgx.Outbox
	schema string
}

func newPGOutbox(t testing.TB) *pgOutbox {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		outboxtest.RequireService(t, "PostgreSQL at "+pgURL(), err)
	}
	schema := "outboxnats_" + unique()
	o, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return &pgOutbox{pool: pool, outbox: o, schema: schema}
}

// publish writes events in one committed transaction.
func (p *pgOutbox) publish(t testing.TB, events ...outbox.Encodable) {
	t.Helper()
	ctx := context.Background()
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := p.outbox.Publish(ctx, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func (p *pgOutbox) count(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+p.schema+"."+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
