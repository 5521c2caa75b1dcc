package outboxtest

import (
	"bytes"
	"cmp"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	outboxce "github.com/txoutbox/outbox/cloudevents"
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
			m, err := outboxce.FromBinary(fm.Headers, fm.Body)
			if err != nil {
				t.Fatalf("FromBinary: %v", err)
			}
			if err := checkForeign(fm.Name, m); err != nil {
				t.Error(err)
			}
			if fm.Structured() {
				s, err := outboxce.FromStructured(fm.Body)
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
			h, err := outboxce.ToBinary(m, "/elsewhere")
			if err != nil {
				t.Fatal(err)
			}
			if again, err := outboxce.FromBinary(h, m.Body); err != nil || !reflect.DeepEqual(again, want) {
				t.Errorf("binary mode, written and read again:\n got %+v, %v\nwant %+v", again, err, want)
			}
			doc, err := outboxce.ToStructured(m, "/elsewhere")
			if err != nil {
				t.Fatal(err)
			}
			if again, err := outboxce.FromStructured(doc); err != nil || !reflect.DeepEqual(again, want) {
				t.Errorf("structured mode, written and read again:\n got %+v, %v\nwant %+v", again, err, want)
			}
		})
	}
}

// TestForeignGoldenIsSDKOutput regenerates testdata/cloudevents-js.json with the pinned
// CloudEvents JavaScript SDK and compares: the file is what the script writes.
func TestForeignGoldenIsSDKOutput(t *testing.T) {
	t.Parallel()
	services, err := filepath.Abs("../scripts/services")
	if err != nil {
		t.Fatal(err)
	}
	_, err = os.Stat(filepath.Join(services, "node_modules", "cloudevents"))
	if err == nil {
		_, err = exec.LookPath("node")
	}
	RequireService(t, "the CloudEvents JavaScript SDK (node, and scripts/services/up.sh's npm install)", err)
	out, err := exec.Command("node", filepath.Join(services, "foreign-cloudevents.mjs")).Output()
	if err != nil {
		t.Fatalf("node foreign-cloudevents.mjs: %v", err)
	}
	if !bytes.Equal(out, foreignGolden) {
		t.Fatal("testdata/cloudevents-js.json differs from what scripts/services/foreign-cloudevents.mjs writes; regenerate it:\n" +
			"  node scripts/services/foreign-cloudevents.mjs > outboxtest/testdata/cloudevents-js.json")
	}
}
