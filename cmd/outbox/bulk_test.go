package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxtest"
)

// bulkEventID is the event ID of the n-th dead letter seedBulk writes.
func bulkEventID(n int) uuid.UUID {
	return uuid.MustParse(fmt.Sprintf("00000000-0000-4000-8000-%012d", n))
}

// seedBulk writes n pending dead letters of type "cli.bulk" with plain multi-row INSERTs
// (Add would commit each on its own, which is not what this test is about).
func seedBulk(t *testing.T, tb *testDB, n int) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	var at any = now
	if tb.Dialect == "sqlite" {
		at = now.Format("2006-01-02 15:04:05.000")
	}
	const cols = 13
	rows := 500 // SQLite binds at most 32,766 parameters
	for start := 1; start <= n; start += rows {
		end := min(start+rows-1, n)
		var values []string
		var args []any
		for i := start; i <= end; i++ {
			ph := make([]string, cols)
			for j := range ph {
				ph[j] = "?"
				if tb.Dialect == "postgres" {
					ph[j] = fmt.Sprintf("$%d", len(args)+j+1)
				}
			}
			values = append(values, "("+strings.Join(ph, ",")+")")
			args = append(args, bulkEventID(i).String(), "cli.bulk", "", "application/json", []byte(fmt.Sprintf(`{"n":%d}`, i)),
				at, "consumer", "gave-up", "bulk-consumer", "handler was down", 3, at, at)
		}
		_, err := tb.DB.ExecContext(ctx, "INSERT INTO "+tb.table("_dead_letters")+
			" (event_id, event_type, event_key, content_type, body, created_at, stage, kind, consumer, reason, attempts, first_failed_at, last_failed_at) VALUES "+
			strings.Join(values, ","), args...)
		if err != nil {
			t.Fatal(err)
		}
	}
}

// countingSender records how often each event ID was sent.
type countingSender struct {
	mu   sync.Mutex
	sent map[uuid.UUID]int
}

func (s *countingSender) Send(_ context.Context, msgs []outbox.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.sent[m.ID]++
	}
	return nil
}

// TestReplay10000: replaying 10,000 dead letters by filter draws a progress bar on a
// terminal, ends with the count, and the relay then delivers each replayed event once.
func TestReplay10000(t *testing.T) {
	outboxtest.SkipIfShort(t, "10,000 transactions per database")
	const n = 10000
	forEachDialect(t, func(t *testing.T, tb *testDB) {
		tb.migrate(t)
		seedBulk(t, tb, n)
		start := time.Now()
		r := run(t, tb, runOpts{stderrTTY: true}, "dead-letters", "replay", "--all-matching", "--type", "cli.bulk", "--yes")
		t.Logf("%s: replayed %d dead letters in %v", tb.Dialect, n, time.Since(start).Round(time.Millisecond))
		if r.code != 0 || r.stdout != "replayed 10,000 of 10,000\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, "\rreplaying [##############################] 10,000/10,000 100%") || !strings.HasSuffix(r.stderr, "\n") {
			t.Fatalf("no finished progress bar on the terminal: %q", r.stderr[max(0, len(r.stderr)-300):])
		}
		if backlog := tb.scalar(t, "SELECT count(*) FROM "+tb.table("")); backlog != n {
			t.Fatalf("outbox holds %d events after the replay, want %d", backlog, n)
		}

		store, err := tb.outbox.NewStore(tb.DB)
		if err != nil {
			t.Fatal(err)
		}
		sender := &countingSender{sent: map[uuid.UUID]int{}}
		relay, err := relay.New(store, sender, &relay.Config{BatchSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for {
			sent, err := relay.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if sent == 0 {
				break
			}
		}
		if len(sender.sent) != n {
			t.Fatalf("%d distinct events delivered, want %d", len(sender.sent), n)
		}
		for i := 1; i <= n; i++ {
			if c := sender.sent[bulkEventID(i)]; c != 1 {
				t.Fatalf("event %d delivered %d times, want once", i, c)
			}
		}
		if pending := tb.scalar(t, "SELECT count(*) FROM "+tb.table("_dead_letters")+" WHERE status = 'pending'"); pending != 0 {
			t.Fatalf("%d dead letters still pending", pending)
		}
	})
}

// TestProgressLines: without a terminal, progress is plain lines, at most one per 10 %.
func TestProgressLines(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	a := newApp(strings.NewReader(""), &b, &b, func(string) string { return "" })
	p := a.newProgress("auto", "replaying", 50)
	for i := 1; i <= 50; i++ {
		p.update(i)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) < 1 || len(lines) > 11 || !strings.HasPrefix(lines[len(lines)-1], "replaying 50 of 50 (100%)") || strings.Contains(b.String(), "\r") {
		t.Fatalf("progress without a terminal:\n%s", b.String())
	}
}
