package outboxrabbitmq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
)

// node runs testdata/cloudevents-amqp.cjs with the CloudEvents JavaScript SDK and amqplib
// that scripts/services/up.sh installs, and returns its standard output.
func node(t *testing.T, args ...string) []byte {
	t.Helper()
	modules, err := filepath.Abs("../../scripts/services/node_modules")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(modules, "cloudevents", "package.json"))
	}
	outboxtest.RequireService(t, "node with the cloudevents and amqplib packages (scripts/services/up.sh installs them)", err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"testdata/cloudevents-amqp.cjs"}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %v: %v\n%s", args, err, stderr.Bytes())
	}
	return out
}

// TestInteropJavaScriptReads: the official CloudEvents JavaScript SDK, reading a message
// the Sender published (through amqplib, mapped as the AMQP binding says), builds a valid
// CloudEvent in strict mode with every attribute as sent: the spec's required and
// optional attributes, the partitionkey extension, a traceparent extension and the
// txheaders extension carrying a header that is not a valid extension name.
func TestInteropJavaScriptReads(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{Source: "/orders-service"}, outboxrabbitmq.ReceiverConfig{})
	m := message("orders.placed", "customer-7", `{"order_id":"o-1","note":"ünïcode"}`)
	m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
	if err := d.sender.Send(context.Background(), []outbox.Message{m}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(node(t, "read", outboxtest.AMQPURL(), d.top.Queue), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"specversion": "1.0", "id": m.ID.String(), "type": "orders.placed", "source": "/orders-service",
		"datacontenttype": "application/json",
		"partitionkey":    "customer-7", "traceparent": m.Headers["traceparent"], "txheaders": `{"X-Tenant":"acme"}`,
		"data": map[string]any{"order_id": "o-1", "note": "ünïcode"},
	}
	for k, v := range want {
		if gv, _ := json.Marshal(got[k]); !bytes.Equal(gv, must(json.Marshal(v))) {
			t.Errorf("the SDK read %s = %s, want %v", k, gv, v)
		}
	}
	// JavaScript dates keep milliseconds: the SDK rounds the time to them.
	if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(got["time"])); err != nil || !at.Equal(m.CreatedAt.Truncate(time.Millisecond)) {
		t.Errorf("the SDK read time %v, want %v to the millisecond", got["time"], m.CreatedAt)
	}
	delete(got, "time")
	if len(got) != len(want) {
		t.Errorf("the SDK read %v, want exactly %v", got, want)
	}
}

// TestInteropJavaScriptWrites: a CloudEvent the JavaScript SDK built and published through
// amqplib as the AMQP binding says is received by the Receiver and decodes into the typed
// event, its partition key and source intact.
func TestInteropJavaScriptWrites(t *testing.T) {
	t.Parallel()
	d := newDestination(t, outboxrabbitmq.Topology{}, outboxrabbitmq.SenderConfig{}, outboxrabbitmq.ReceiverConfig{})
	id := uuid.Must(uuid.NewV7())
	node(t, "write", outboxtest.AMQPURL(), d.top.Exchange, "orders.placed", id.String())
	dl := outboxtest.ReceiveN(t, d.receiver, 1, 10*time.Second)[0]
	m, err := dl.Message()
	if err != nil {
		t.Fatal(err)
	}
	e, err := outbox.Decode[orderPlaced](m)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != id || e.Key != "customer-js" || e.Payload != (orderPlaced{OrderID: "js-1", Note: "from JavaScript"}) || m.CreatedAt.IsZero() {
		t.Errorf("received %+v (created %v)", e, m.CreatedAt)
	}
	if err := dl.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
