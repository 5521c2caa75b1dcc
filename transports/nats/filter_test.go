package outboxnats_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
)

type orderCancelled struct{ OrderID string }

func (orderCancelled) EventType() string { return "orders.cancelled" }

type cartAbandoned struct{ CartID string }

func (cartAbandoned) EventType() string { return "carts.abandoned" }

// TestFilterSubjectsReceiveOnlyTheirTypes: on a stream shared by several event types, a
// consumer whose FilterSubjects come from SubjectsFor receives only its types, while the
// stream's unfiltered consumer receives them all. Several filters need nats-server 2.10:
// on an older server Provision refuses them rather than deliver everything.
func TestFilterSubjectsReceiveOnlyTheirTypes(t *testing.T) {
	t.Parallel()
	nc, js := connect(t)
	d := newDestination(t, js, outboxnats.Topology{}, outboxnats.SenderConfig{})
	info := d.stream.CachedInfo()
	routing := &outboxnats.SenderConfig{SubjectPrefix: d.prefix}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	filtered := func(name string, types ...string) (*outboxnats.Receiver, error) {
		subjects, err := outboxnats.SubjectsFor(routing, types...)
		if err != nil {
			t.Fatal(err)
		}
		_, c, err := outboxnats.Provision(ctx, js, outboxnats.Topology{Stream: info.Config.Name, Subjects: info.Config.Subjects,
			Consumer: name, FilterSubjects: subjects})
		if err != nil {
			return nil, err
		}
		return outboxnats.NewReceiver(c, &outboxnats.ReceiverConfig{MaxWait: 200 * time.Millisecond})
	}
	billing, err := filtered("billing", orderPlaced{}.EventType())
	if err != nil {
		t.Fatal(err)
	}
	multi, multiErr := filtered("orders_and_carts", orderPlaced{}.EventType(), cartAbandoned{}.EventType())

	var msgs []outbox.Message
	for i, e := range []outbox.Encodable{outbox.New(orderPlaced{OrderID: "1"}), outbox.New(orderCancelled{OrderID: "1"}),
		outbox.New(cartAbandoned{CartID: "c"}), outbox.New(orderPlaced{OrderID: "2"})} {
		m, err := e.Encode()
		if err != nil {
			t.Fatal(i, err)
		}
		msgs = append(msgs, m)
	}
	if err := d.sender.Send(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	types := func(r outbox.Receiver, n int) []string {
		var out []string
		for _, m := range receiveAll(t, r, n) {
			out = append(out, m.Type)
		}
		slices.Sort(out)
		// Nothing else comes: the next long poll ends empty.
		if more, err := r.Receive(ctx, 10); err != nil || len(more) != 0 {
			t.Fatalf("after %d messages, %d more arrived (%v)", n, len(more), err)
		}
		return out
	}
	if got, want := types(billing, 2), []string{"orders.placed", "orders.placed"}; !slices.Equal(got, want) {
		t.Errorf("the filtered consumer received %v, want %v", got, want)
	}
	if got := types(d.receiver, 4); len(got) != 4 {
		t.Errorf("the unfiltered consumer received %v, want all 4", got)
	}
	switch {
	case multiErr != nil && !strings.Contains(multiErr.Error(), "2.10"):
		t.Fatalf("several FilterSubjects: %v", multiErr)
	case multiErr != nil:
		t.Logf("nats-server %s: several FilterSubjects refused as expected: %v", nc.ConnectedServerVersion(), multiErr)
	default:
		if got, want := types(multi, 3), []string{"carts.abandoned", "orders.placed", "orders.placed"}; !slices.Equal(got, want) {
			t.Errorf("the consumer filtered on two types received %v, want %v", got, want)
		}
	}
}

// TestSubjectsForFollowsTheSendersRouting: SubjectsFor routes each type as the Sender
// does (prefix, fixed subjects), without repeats, and refuses what a Sender could not
// publish to, or routing it cannot predict.
func TestSubjectsForFollowsTheSendersRouting(t *testing.T) {
	t.Parallel()
	got, err := outboxnats.SubjectsFor(&outboxnats.SenderConfig{SubjectPrefix: "shop", Subjects: map[string]string{"orders.placed": "orders.v2.placed"}},
		"orders.placed", "carts.abandoned", "orders.placed")
	if want := []string{"orders.v2.placed", "shop.carts.abandoned"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("SubjectsFor = %v, %v; want %v", got, err, want)
	}
	if got, err := outboxnats.SubjectsFor(nil, "orders.placed"); err != nil || !slices.Equal(got, []string{"events.orders.placed"}) {
		t.Fatalf("SubjectsFor(nil) = %v, %v", got, err)
	}
	if _, err := outboxnats.SubjectsFor(nil, "bad type"); err == nil {
		t.Fatal("a type with a space gave a subject")
	}
	if _, err := outboxnats.SubjectsFor(&outboxnats.SenderConfig{Subject: func(outbox.Message) string { return "x" }}, "a"); err == nil {
		t.Fatal("routing by function gave subjects")
	}
}
