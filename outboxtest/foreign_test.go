package outboxtest

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

// TestForeignMessagesDecode reads every message of the official CloudEvents JavaScript SDK
// through the wire format alone (no broker): binary mode with FromBinary, structured mode
// with both FromBinary (a binding with headers) and FromStructured (one without). Writing a
// decoded message and reading it back gives the same message, ids and attributes included.
func TestForeignMessagesDecode(t *testing.T) {
	t.Parallel()
	msgs := ForeignMessages()
	if len(msgs) != len(foreignWants) {
		t.Fatalf("%d golden messages, %d expectations", len(msgs), len(foreignWants))
	}
	for _, fm := range msgs {
		t.Run(fm.Name, func(t *testing.T) {
			t.Parallel()
			m, err := cloudevents.FromBinary(fm.Headers, fm.Body)
			if err != nil {
				t.Fatalf("FromBinary: %v", err)
			}
			if err := checkForeign(fm.Name, m); err != nil {
				t.Error(err)
			}
			if fm.Structured() {
				s, err := cloudevents.FromStructured(fm.Body)
				if err != nil {
					t.Fatalf("FromStructured: %v", err)
				}
				if err := checkForeign(fm.Name, s); err != nil {
					t.Errorf("FromStructured: %v", err)
				}
			}
			// Written, an absent content type becomes JSON, what it meant.
			want := m
			want.ContentType = cmp.Or(m.ContentType, "application/json")
			h, err := cloudevents.ToBinary(m, "/elsewhere")
			if err != nil {
				t.Fatal(err)
			}
			if again, err := cloudevents.FromBinary(h, m.Body); err != nil || !reflect.DeepEqual(again, want) {
				t.Errorf("binary mode, written and read again:\n got %+v, %v\nwant %+v", again, err, want)
			}
			doc, err := cloudevents.ToStructured(m, "/elsewhere")
			if err != nil {
				t.Fatal(err)
			}
			if again, err := cloudevents.FromStructured(doc); err != nil || !reflect.DeepEqual(again, want) {
				t.Errorf("structured mode, written and read again:\n got %+v, %v\nwant %+v", again, err, want)
			}
		})
	}
}

// requireJSSDK returns scripts/services, where the CloudEvents JavaScript SDK is installed,
// or skips (fails under CI) when node or the SDK is missing.
func requireJSSDK(t *testing.T) string {
	t.Helper()
	services, err := filepath.Abs("../scripts/services")
	if err != nil {
		t.Fatal(err)
	}
	_, err = os.Stat(filepath.Join(services, "node_modules", "cloudevents"))
	if err == nil {
		_, err = exec.LookPath("node")
	}
	RequireService(t, "the CloudEvents JavaScript SDK (node, and scripts/services/up.sh's npm install)", err)
	return services
}

// TestForeignGoldenIsSDKOutput regenerates testdata/cloudevents-js.json with the pinned
// CloudEvents JavaScript SDK and compares: the file is what the script writes.
func TestForeignGoldenIsSDKOutput(t *testing.T) {
	t.Parallel()
	services := requireJSSDK(t)
	out, err := exec.Command("node", filepath.Join(services, "foreign-cloudevents.mjs")).Output()
	if err != nil {
		t.Fatalf("node foreign-cloudevents.mjs: %v", err)
	}
	if !bytes.Equal(out, foreignGolden) {
		t.Fatal("testdata/cloudevents-js.json differs from what scripts/services/foreign-cloudevents.mjs writes; regenerate it:\n" +
			"  node scripts/services/foreign-cloudevents.mjs > outboxtest/testdata/cloudevents-js.json")
	}
}

// TestJavaScriptSDKReadsOurMessages: the official CloudEvents JavaScript SDK reads what our
// encoder writes, in binary and structured mode: our own events (trace context, a JSON
// payload with U+FFFF, a binary payload) and foreign ones written back (the original id and
// source, subject, dataschema, typed extensions).
func TestJavaScriptSDKReadsOurMessages(t *testing.T) {
	t.Parallel()
	services := requireJSSDK(t)
	own := testMessage("order-42", "{\"note\":\"a\uffffb\",\"html\":\"<&>\"}")
	own.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme"}
	blob := testMessage("", "")
	blob.ContentType, blob.Body = "application/octet-stream", []byte{0, 1, 2, 254, 255}
	msgs := []outbox.Message{own, blob}
	for _, fm := range ForeignMessages() {
		if fm.Name == "http-binary-string-id" || fm.Name == "http-structured-typed-extensions" {
			m, err := cloudevents.FromBinary(fm.Headers, fm.Body)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
		}
	}
	type wire struct {
		Headers    map[string]string `json:"headers"`
		Body       *string           `json:"body,omitempty"`
		BodyBase64 *string           `json:"body_base64,omitempty"`
	}
	var in []wire
	for _, m := range msgs {
		h, err := cloudevents.ToBinary(m, "/txoutbox-test")
		if err != nil {
			t.Fatal(err)
		}
		// A text body as a string (what the SDK's HTTP examples pass), other bytes as a Buffer.
		if body := string(m.Body); utf8.ValidString(body) {
			in = append(in, wire{Headers: h, Body: &body})
		} else {
			b64 := base64.StdEncoding.EncodeToString(m.Body)
			in = append(in, wire{Headers: h, BodyBase64: &b64})
		}
		doc, err := cloudevents.ToStructured(m, "/txoutbox-test")
		if err != nil {
			t.Fatal(err)
		}
		text := string(doc)
		in = append(in, wire{Headers: map[string]string{"content-type": cloudevents.StructuredContentType}, Body: &text})
	}
	input, _ := json.Marshal(in)
	cmd := exec.Command("node", filepath.Join(services, "read-cloudevents.mjs"))
	cmd.Stdin = bytes.NewReader(input)
	output, err := cmd.Output()
	if err != nil {
		t.Fatalf("node read-cloudevents.mjs: %v", err)
	}
	var read []struct {
		Attributes map[string]any  `json:"attributes"`
		Data       json.RawMessage `json:"data"`
		DataBase64 *string         `json:"data_base64"`
		Error      string          `json:"error"`
	}
	if err := json.Unmarshal(output, &read); err != nil || len(read) != len(in) {
		t.Fatalf("SDK output %s: %v", output, err)
	}
	for i, r := range read {
		m, mode := msgs[i/2], [2]string{"binary", "structured"}[i%2]
		if r.Error != "" {
			t.Errorf("%s mode, message %s: the SDK refused it: %s", mode, m.ID, r.Error)
			continue
		}
		h, _ := cloudevents.ToBinary(m, "/txoutbox-test")
		for k, v := range h {
			name, ok := strings.CutPrefix(k, cloudevents.HeaderPrefix)
			if k == cloudevents.ContentTypeHeader {
				name, ok = "datacontenttype", true
			}
			if got := fmt.Sprint(r.Attributes[name]); ok && name != "time" && got != v {
				t.Errorf("%s mode, message %s: the SDK read %s = %q, want %q", mode, m.ID, name, got, v)
			}
		}
		if m.CreatedAt.IsZero() {
			continue
		}
		if tm, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r.Attributes["time"])); !tm.Equal(m.CreatedAt.Truncate(time.Millisecond)) {
			t.Errorf("%s mode, message %s: the SDK read time %v, want %v", mode, m.ID, r.Attributes["time"], m.CreatedAt)
		}
		switch {
		case cloudevents.IsJSON(m.ContentType):
			// In binary mode the SDK parses application/json only: other +json data stays text.
			var text string
			if json.Unmarshal(r.Data, &text) == nil && mode == "binary" {
				r.Data = []byte(text)
			}
			if !sameJSONValue(r.Data, m.Body) {
				t.Errorf("%s mode, message %s: the SDK read data %s, want %s", mode, m.ID, r.Data, m.Body)
			}
		case r.DataBase64 == nil || *r.DataBase64 != base64.StdEncoding.EncodeToString(m.Body):
			t.Errorf("%s mode, message %s: the SDK read data %s / %v, want the bytes %v", mode, m.ID, r.Data, r.DataBase64, m.Body)
		}
	}
}
