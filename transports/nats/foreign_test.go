package outboxnats_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/cloudevents"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/outboxtest"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

type shopOrder struct {
	Order int    `json:"order"`
	Note  string `json:"note"`
}

func (shopOrder) EventType() string { return "shop.order.created" }

// TestForeignEventHandledOnce: a CloudEvent of the JavaScript SDK whose id is not a UUID,
// delivered three times (in binary mode, again in structured mode, again as a producer's
// retry), has one effect through the inbox; the same id from another source is another
// event, with its own effect.
func TestForeignEventHandledOnce(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	p := pgxtest.New(t, "outboxnats")
	ctx := context.Background()
	if _, err := p.Pool.Exec(ctx, "CREATE TABLE "+p.Schema+".effects (event_id uuid NOT NULL, foreign_id text NOT NULL, source text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	d := newDestination(t, js, outboxnats.Topology{Storage: jetstream.MemoryStorage}, outboxnats.SenderConfig{})
	golden := map[string]outboxtest.ForeignMessage{}
	for _, m := range outboxtest.ForeignMessages() {
		golden[m.Name] = m
	}
	publish := func(m outboxtest.ForeignMessage) {
		t.Helper()
		msg := &nats.Msg{Subject: d.prefix + ".foreign", Header: nats.Header{}, Data: m.Body}
		for k, v := range m.Headers {
			msg.Header[k] = []string{v}
		}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"http-binary-string-id", "http-structured-string-id", "http-binary-string-id", "http-binary-string-id-other-source"} {
		publish(golden[name])
	}

	dead, err := p.Outbox.NewDeadLetters(p.Pool)
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(d.receiver, &consumer.Config{
		Name: "foreign", DeadLetters: dead, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	consumer.Handle(c, outboxpgx.Idempotent(p.Outbox, p.Pool, func(ctx context.Context, tx pgx.Tx, e outbox.Event[shopOrder]) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+p.Schema+".effects VALUES ($1, $2, $3)",
			e.ID, e.Headers[cloudevents.IDHeader], e.Headers[cloudevents.SourceHeader])
		return err
	}, nil))
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	outboxtest.WaitFor(t, 30*time.Second, "all four deliveries handled and acknowledged", func() bool {
		ci, err := d.consumer.Info(ctx)
		return err == nil && ci.AckFloor.Stream == 4 && ci.NumAckPending == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	rows, err := p.Pool.Query(ctx, "SELECT event_id::text, foreign_id, source FROM "+p.Schema+".effects ORDER BY source")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ ID, ForeignID, Source string }])
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ ID, ForeignID, Source string }{
		{cloudevents.EventID("/shop/orders", "order-42-created").String(), "order-42-created", "/shop/orders"},
		{cloudevents.EventID("/shop/returns", "order-42-created").String(), "order-42-created", "/shop/returns"},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("effects %v, want one per (source, id): %v", got, want)
	}
	if n := p.Count(t, "outbox_dead_letters"); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
}
