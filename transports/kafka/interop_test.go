package outboxkafka_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
)

// jsSDK runs testdata/cloudevents-kafka.js with the CloudEvents JavaScript SDK that
// scripts/services/up.sh installs (npm "cloudevents", pinned in its package.json).
func jsSDK(t *testing.T, req any) []byte {
	t.Helper()
	modules, err := filepath.Abs("../../scripts/services/node_modules")
	if err != nil {
		t.Fatal(err)
	}
	if _, err = exec.LookPath("node"); err == nil {
		_, err = os.Stat(filepath.Join(modules, "cloudevents", "package.json"))
	}
	outboxtest.RequireService(t, "node with the CloudEvents JS SDK (scripts/services/up.sh installs it)", err)
	in, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "testdata/cloudevents-kafka.js")
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	return out
}

// TestInteropCloudEventsJS: the CloudEvents JavaScript SDK's Kafka binding reads the
// records our Sender produces — every attribute, the extensions, the key, the data — and
// validates them; and our Receiver reads a record that SDK wrote in binary mode.
func TestInteropCloudEventsJS(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	d := newDestination(t, c, nil)
	m := message("orders.created", "customer-7", `{"order":"o-1","total":42}`)
	m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
	keyless := message("orders.cancelled", "", `{"order":"o-2"}`)
	if err := d.sender.Send(context.Background(), []outbox.Message{m, keyless}); err != nil {
		t.Fatal(err)
	}
	type jsRecord struct {
		Key         *string           `json:"key"`
		Headers     map[string]string `json:"headers"`
		ValueBase64 string            `json:"value_base64"`
	}
	var records []jsRecord
	for _, r := range readRecords(t, c, d.topic, 2) {
		jr := jsRecord{Headers: map[string]string{}, ValueBase64: base64.StdEncoding.EncodeToString(r.Value)}
		if r.Key != nil {
			k := string(r.Key)
			jr.Key = &k
		}
		for _, h := range r.Headers {
			jr.Headers[h.Key] = string(h.Value)
		}
		records = append(records, jr)
	}
	foreignID := uuid.Must(uuid.NewV7())
	out := jsSDK(t, map[string]any{
		"records": records,
		"write":   map[string]any{"id": foreignID.String(), "type": "payments.settled", "partitionkey": "customer-9", "data": map[string]any{"amount": 5}},
	})
	var res struct {
		Events  []map[string]any `json:"events"`
		Written struct {
			Key     string            `json:"key"`
			Headers map[string]string `json:"headers"`
			Value   string            `json:"value"`
		} `json:"written"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	byID := map[string]map[string]any{}
	for _, e := range res.Events {
		byID[e["id"].(string)] = e
	}
	got := byID[m.ID.String()]
	if got == nil {
		t.Fatalf("the SDK did not read event %s: %s", m.ID, out)
	}
	for k, want := range map[string]any{
		"specversion":     "1.0",
		"type":            m.Type,
		"source":          "/txoutbox",
		"time":            m.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z"), // the SDK keeps milliseconds
		"datacontenttype": "application/json",
		"partitionkey":    m.Key,
		"traceparent":     m.Headers["traceparent"],
		"txheaders":       `{"X-Tenant":"acme"}`,
	} {
		if got[k] != want {
			t.Errorf("the SDK read %s = %v, want %v", k, got[k], want)
		}
	}
	if data, _ := json.Marshal(got["data"]); !bytes.Equal(data, m.Body) {
		t.Errorf("the SDK read data %s, want %s", data, m.Body)
	}
	if e := byID[keyless.ID.String()]; e == nil || e["type"] != keyless.Type {
		t.Errorf("the SDK read the keyless event as %v", e)
	}

	// The other way: a record the SDK wrote, produced as is, is a message to our Receiver.
	w := res.Written
	rec := &kgo.Record{Topic: d.topic, Key: []byte(w.Key), Value: []byte(w.Value)}
	for k, v := range w.Headers {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	if err := d.client.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var foreign outbox.Message
	outboxtest.ReceiveEach(t, d.receiver, 3, 10*time.Second, func(dl outbox.Delivery) {
		msg, err := dl.Message()
		if err != nil {
			var me *outbox.MalformedError
			if errors.As(err, &me) {
				t.Errorf("our receiver could not read the SDK's record: %v (headers %v)", err, me.Attributes)
			} else {
				t.Error(err)
			}
		}
		if msg.ID == foreignID {
			foreign = msg
		}
		_ = dl.Ack(context.Background())
	})
	if foreign.Type != "payments.settled" || foreign.Key != "customer-9" || string(foreign.Body) != `{"amount":5}` || foreign.ContentType != "application/json" {
		t.Errorf("our receiver read the SDK's record as %+v", foreign)
	}
}
