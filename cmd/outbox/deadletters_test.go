package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
)

// seeded are the dead letters seedDeadLetters adds, by name, with their IDs.
type seeded map[string]int64

// seedDeadLetters adds one dead letter of each interesting shape.
func seedDeadLetters(t *testing.T, tb *testDB) seeded {
	t.Helper()
	ctx := context.Background()
	dead := tb.deadLetters(t)
	placed, err := outbox.New(Placed{Order: 42, Note: "rush"}, outbox.WithKey("order-42"), outbox.WithHeader("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")).Encode()
	if err != nil {
		t.Fatal(err)
	}
	script, _ := outbox.New(Placed{Order: 7}).Encode()
	script.Body = []byte(`{"order":7,"note":"<script>alert(1)</script>"}`) // as another producer may write it
	large, _ := outbox.New(Placed{Order: 9}).Encode()
	entries := []struct {
		name string
		e    deadletter.Entry
	}{
		{"gave-up", deadletter.Entry{Message: placed, Stage: deadletter.StageConsumer, Kind: deadletter.KindGaveUp, Consumer: "billing",
			Reason: "gave up after 5 attempts: payment service timeout", Attempts: 5}},
		{"script", deadletter.Entry{Message: script, Stage: deadletter.StageConsumer, Kind: deadletter.KindPermanent, Consumer: "mailer",
			Reason: "template failed: \x1b[31mred\x1b[0m", Attempts: 1}},
		{"too-large", deadletter.Entry{Message: large, Stage: deadletter.StageRelay, Kind: deadletter.KindTooLarge,
			Reason: "message is 300 KiB, over the SQS limit of 256 KiB", Attempts: 1}},
		{"malformed", deadletter.Entry{Stage: deadletter.StageConsumer, Kind: deadletter.KindMalformed, Consumer: "billing",
			Reason: "not a CloudEvent: no ce-type", BrokerMessageID: "sqs-msg-7", Attempts: 1,
			Raw: &deadletter.Raw{Attributes: map[string]string{"ce-id": "x"}, Body: []byte{0xff, 0x00, 'a', 'b'}}}},
	}
	ids := seeded{}
	for _, x := range entries {
		if err := dead.Add(ctx, x.e); err != nil {
			t.Fatal(err)
		}
		es, err := dead.List(ctx, deadletter.Filter{Kind: x.e.Kind})
		if err != nil || len(es) != 1 {
			t.Fatalf("finding %s: %v, %v", x.name, es, err)
		}
		ids[x.name] = es[0].ID
	}
	ids["event:gave-up"] = 0
	return ids
}

// listIDs runs "dead-letters list --json" with args and returns the IDs listed.
func listIDs(t *testing.T, tb *testDB, args ...string) []int64 {
	t.Helper()
	r := ok(t, tb, append([]string{"dead-letters", "list", "--json"}, args...)...)
	var es []entryJSON
	if err := json.Unmarshal([]byte(r.stdout), &es); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	ids := make([]int64, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	return ids
}

// TestDeadLettersList: every filter selects what it names, alone and together; bad values
// are refused naming their flag; text from the table cannot drive the terminal.
func TestDeadLettersList(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		tb.migrate(t)
		ids := seedDeadLetters(t, tb)
		var eventID string
		{
			r := ok(t, tb, "dead-letters", "show", "--json", strconv.FormatInt(ids["gave-up"], 10))
			var e entryJSON
			if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
				t.Fatal(err)
			}
			eventID = e.Event.ID
		}
		id := func(name string) string { return strconv.FormatInt(ids[name], 10) }
		for _, c := range []struct {
			args []string
			want []string
		}{
			{nil, []string{"gave-up", "script", "too-large", "malformed"}},
			{[]string{"--type", "orders.placed"}, []string{"gave-up", "script", "too-large"}},
			{[]string{"--stage", "relay"}, []string{"too-large"}},
			{[]string{"--consumer", "billing"}, []string{"gave-up", "malformed"}},
			{[]string{"--kind", "malformed"}, []string{"malformed"}},
			{[]string{"--reason", "SQS limit"}, []string{"too-large"}},
			{[]string{"--reason", "sqs limit"}, nil}, // case-sensitive
			{[]string{"--since", "1h"}, []string{"gave-up", "script", "too-large", "malformed"}},
			{[]string{"--until", "1h"}, nil},
			{[]string{"--since", "2000-01-01", "--until", "2999-01-01T00:00:00Z"}, []string{"gave-up", "script", "too-large", "malformed"}},
			{[]string{"--id", id("script")}, []string{"script"}},
			{[]string{"--id", id("script"), "--stage", "relay"}, nil},
			{[]string{"--event-id", eventID}, []string{"gave-up"}},
			{[]string{"--broker-message-id", "sqs-msg-7"}, []string{"malformed"}},
			{[]string{"--consumer", "billing", "--kind", "gave-up"}, []string{"gave-up"}},
			{[]string{"--status", "discarded"}, nil},
			{[]string{"--limit", "2"}, []string{"gave-up", "script"}},
			{[]string{"--after", id("script")}, []string{"too-large", "malformed"}},
		} {
			got := listIDs(t, tb, c.args...)
			var want []int64
			for _, name := range c.want {
				want = append(want, ids[name])
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("list %v: %v, want %v (%v)", c.args, got, want, c.want)
			}
		}

		r := ok(t, tb, "dead-letters", "list")
		if strings.Contains(r.stdout, "\x1b") || !strings.Contains(r.stdout, `\x1b[31mred`) {
			t.Errorf("a reason's escape sequence reached the terminal:\n%q", r.stdout)
		}
		for _, want := range []string{"ID", "KIND", "gave-up", "gave up after 5 attempts: payment service", "billing"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("list lacks %q:\n%s", want, r.stdout)
			}
		}
		r = ok(t, tb, "dead-letters", "list", "--limit", "1")
		if !strings.Contains(r.stderr, "--after "+id("gave-up")) {
			t.Errorf("a full page does not say how to get the next: %s", r.stderr)
		}

		r = want(t, tb, exitUsage, "dead-letters", "list", "--kind", "exploded", "--since", "yesterday", "--stage", "sender")
		for _, flag := range []string{"--kind", "--since", "--stage"} {
			if !strings.Contains(r.stderr, flag) {
				t.Errorf("the error does not name %s: %s", flag, r.stderr)
			}
		}
	})
}

// TestDeadLettersShow: one entry in full — headers, the payload pretty-printed, the raw
// evidence of a malformed message as a hex dump — in text and JSON; a missing ID exits 3.
func TestDeadLettersShow(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		tb.migrate(t)
		ids := seedDeadLetters(t, tb)
		r := ok(t, tb, "dead-letters", "show", strconv.FormatInt(ids["gave-up"], 10))
		for _, want := range []string{"kind               gave-up", "consumer           billing", "key                order-42",
			"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736", "\"order\": 42,", "\"note\": \"rush\""} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show lacks %q:\n%s", want, r.stdout)
			}
		}
		r = ok(t, tb, "dead-letters", "show", strconv.FormatInt(ids["malformed"], 10))
		for _, want := range []string{"broker message id  sqs-msg-7", "raw evidence", `attribute "ce-id": "x"`, "ff 00 61 62"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show of the malformed entry lacks %q:\n%s", want, r.stdout)
			}
		}
		r = ok(t, tb, "dead-letters", "show", "--json", strconv.FormatInt(ids["malformed"], 10))
		var e entryJSON
		if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
			t.Fatal(err)
		}
		if e.Raw == nil || e.Raw.Base64 != "/wBhYg==" || e.Raw.Attributes["ce-id"] != "x" || e.Event.ID != "" || e.Kind != "malformed" {
			t.Errorf("show --json of the malformed entry: %s", r.stdout)
		}
		want(t, tb, exitNotFound, "dead-letters", "show", "999999")
		want(t, tb, exitUsage, "dead-letters", "show", "abc")
		want(t, tb, exitUsage, "dead-letters", "show")
	})
}

// TestDeadLettersReplayDiscard: by ID, each entry's fate and exit code; by filter, a
// confirmation unless --yes, and on a terminal only.
func TestDeadLettersReplayDiscard(t *testing.T) {
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		tb.migrate(t)
		ids := seedDeadLetters(t, tb)
		id := func(name string) string { return strconv.FormatInt(ids[name], 10) }
		backlog := func() int64 { return tb.scalar(t, "SELECT count(*) FROM "+tb.table("")) }

		r := ok(t, tb, "dead-letters", "replay", id("gave-up"))
		if r.stdout != "replayed "+id("gave-up")+"\n" || backlog() != 1 {
			t.Fatalf("replay: %q, backlog %d", r.stdout, backlog())
		}
		r = want(t, tb, exitRefused, "dead-letters", "replay", id("gave-up"))
		if !strings.Contains(r.stderr, "not pending") {
			t.Errorf("replaying twice: %s", r.stderr)
		}
		r = want(t, tb, exitRefused, "dead-letters", "replay", id("malformed"))
		if !strings.Contains(r.stderr, "cannot be replayed") {
			t.Errorf("replaying a malformed message: %s", r.stderr)
		}
		want(t, tb, exitNotFound, "dead-letters", "replay", "999999")
		ok(t, tb, "dead-letters", "discard", id("malformed"))
		want(t, tb, exitRefused, "dead-letters", "discard", id("malformed"))
		want(t, tb, exitUsage, "dead-letters", "replay", id("script"), "--kind", "permanent")
		want(t, tb, exitUsage, "dead-letters", "replay")

		// By filter: no terminal and no --yes is refused before anything is read.
		r = want(t, tb, exitUsage, "dead-letters", "replay", "--all-matching", "--stage", "relay")
		if !strings.Contains(r.stderr, "--yes") {
			t.Errorf("--all-matching without a terminal: %s", r.stderr)
		}
		// On a terminal, "n" changes nothing and "y" goes ahead.
		r = run(t, tb, runOpts{stdin: "n\n", stdinTTY: true}, "dead-letters", "discard", "--all-matching", "--stage", "relay")
		if r.code != exitFailure || !strings.Contains(r.stderr, "Discard 1 dead letters (stage=\"relay\")") || !strings.Contains(r.stderr, "nothing changed") {
			t.Fatalf("declined: exit %d, %s", r.code, r.stderr)
		}
		r = run(t, tb, runOpts{stdin: "y\n", stdinTTY: true}, "dead-letters", "replay", "--all-matching", "--stage", "relay")
		if r.code != 0 || r.stdout != "replayed 1 of 1\n" || backlog() != 2 {
			t.Fatalf("confirmed: exit %d, stdout %q, stderr %q, backlog %d", r.code, r.stdout, r.stderr, backlog())
		}
		r = ok(t, tb, "dead-letters", "discard", "--all-matching", "--consumer", "mailer", "--yes", "--json")
		var res bulkJSON
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Matched != 1 || res.Done != 1 {
			t.Fatalf("discard --json: %s (%v)", r.stdout, err)
		}
		r = ok(t, tb, "dead-letters", "replay", "--all-matching", "--yes")
		if !strings.Contains(r.stderr, "nothing to replay") {
			t.Errorf("nothing left pending: %q %q", r.stdout, r.stderr)
		}
		if got := listIDs(t, tb, "--status", "all"); len(got) != 4 {
			t.Errorf("entries kept for audit: %v, want all 4", got)
		}
	})
}
