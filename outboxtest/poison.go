package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// RawSQL reaches an adapter's tables with raw SQL, as a producer, a trigger or a person
// that bypasses Publish would. The poison tests use it to spoil rows; they skip when a
// fixture has none.
type RawSQL struct {
	// Dialect is "postgres", "mysql" or "sqlite": the tests write SQL for each.
	Dialect string
	// Exec runs one statement without arguments.
	Exec func(ctx context.Context, query string) error
	// Outbox and DeadLetters are the tables' qualified, quoted names.
	Outbox, DeadLetters string
	// Lock, when set, locks the outbox table on a connection of its own so that every
	// statement of a claim waits (PostgreSQL: LOCK TABLE … IN ACCESS EXCLUSIVE MODE in a
	// transaction; MySQL: LOCK TABLES … WRITE), until unlock is called.
	Lock func(ctx context.Context) (unlock func(), err error)
	// KillWaiting terminates the server connections that wait for Lock's lock, as a
	// database restart or a failover drops a connection in the middle of a statement, and
	// returns how many it terminated. Set with Lock.
	KillWaiting func(ctx context.Context) (int, error)
}

func needSQL(t *testing.T, s *RawSQL) {
	t.Helper()
	if s == nil {
		t.Skip("the fixture has no RawSQL")
	}
}

func (s *RawSQL) exec(t testing.TB, query string) {
	t.Helper()
	if err := s.Exec(context.Background(), query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// now is the dialect's SQL clock expression.
func (s *RawSQL) now() string {
	return map[string]string{"postgres": "now()", "mysql": "UTC_TIMESTAMP(6)", "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')"}[s.Dialect]
}

// refuse makes the dead-letter table refuse rows of event type typ, as a constraint added
// by hand would: content no sanitising can foresee.
func (s *RawSQL) refuse(t testing.TB, typ string) {
	t.Helper()
	name := fmt.Sprintf("outboxtest_refuse_%08x", rand.Uint32())
	switch s.Dialect {
	case "postgres", "mysql":
		s.exec(t, "ALTER TABLE "+s.DeadLetters+" ADD CONSTRAINT "+name+" CHECK (event_type <> '"+typ+"')")
	case "sqlite":
		s.exec(t, "CREATE TRIGGER "+name+" BEFORE INSERT ON "+s.DeadLetters+" WHEN NEW.event_type = '"+typ+
			"' BEGIN SELECT RAISE(ABORT, 'refused by outboxtest'); END")
	default:
		t.Skipf("no refusal SQL for dialect %q", s.Dialect)
	}
}

// plain is a payload whose EventType has a value receiver: a nil *plain cannot name its
// type.
type plain struct{ N int }

func (plain) EventType() string { return "outboxtest.plain" }

type panicky struct{}

func (panicky) EventType() string { panic("EventType panics") }

// nastyText is a value no text column holds as it is: NUL bytes, invalid UTF-8, and more
// characters than MySQL's VARCHAR(255).
func nastyText(prefix string) string {
	return prefix + "\x00nul\xffinvalid" + strings.Repeat("é", 300)
}

// columnLimits are the text limits of a dialect's dead-letter table: characters of the
// short columns and bytes of the reason (0: none). MySQL's are VARCHAR(255) and TEXT.
func columnLimits(s *RawSQL) (chars, bytes int) {
	if s != nil && s.Dialect == "mysql" {
		return 255, 65535
	}
	return 0, 0
}

// expectStorable fails unless s is what a text column holds: valid UTF-8, no NUL, at most
// maxChars characters and maxBytes bytes (0: any).
func expectStorable(t testing.TB, field, s string, maxChars, maxBytes int) {
	t.Helper()
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) || maxChars > 0 && utf8.RuneCountInString(s) > maxChars || maxBytes > 0 && len(s) > maxBytes {
		t.Errorf("%s %.60q… (%d bytes) was stored as is: want valid UTF-8 without NUL, at most %d characters and %d bytes", field, s, len(s), maxChars, maxBytes)
	}
}

// exercisePoisonStore runs the store side of "poison never stalls anything": Publish
// refuses what no transport carries without panicking, one unreadable outbox row is
// dead-lettered alone, and a dead letter is stored whatever its content.
func exercisePoisonStore(t *testing.T, newFixture func(t *testing.T) *StoreFixture) {
	ctx := context.Background()

	t.Run("PublishNeverPanics", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		id := func() uuid.UUID { return uuid.Must(uuid.NewV7()) }
		bad := []struct {
			name string
			e    outbox.Encodable
		}{
			{"a nil Encodable", nil},
			{"a nil *Message", (*outbox.Message)(nil)},
			{"a nil pointer payload with a value-receiver EventType", outbox.New[*plain](nil)},
			{"an EventType that panics", outbox.New(panicky{})},
			{"a control character in the type", outbox.Message{ID: id(), Type: "orders\x01placed"}},
			{"a NUL in the type", outbox.Message{ID: id(), Type: "orders\x00placed"}},
			{"invalid UTF-8 in the type", outbox.Message{ID: id(), Type: "orders\xffplaced"}},
			{"a newline in the key", outbox.New(Note{}, outbox.WithKey("a\nb"))},
			{"invalid UTF-8 in the key", outbox.New(Note{}, outbox.WithKey("a\xffb"))},
			{"a leading space in the key", outbox.New(Note{}, outbox.WithKey(" k"))},
			{"a trailing tab in the key", outbox.New(Note{}, outbox.WithKey("k\t"))},
			{"invalid UTF-8 in a header value", outbox.New(Note{}, outbox.WithHeader("h", "v\xff"))},
			{"a NUL in a header value", outbox.New(Note{}, outbox.WithHeader("h", "v\x00"))},
			{"a newline in a header value", outbox.New(Note{}, outbox.WithHeader("h", "v\r\nx: y"))},
			{"a NUL in a header name", outbox.New(Note{}, outbox.WithHeader("h\x00", "v"))},
			{"an empty header name", outbox.New(Note{}, outbox.WithHeader("", "v"))},
		}
		for _, b := range bad {
			err := f.Publish(ctx, true, outbox.New(Note{Text: "fine"}), b.e)
			if !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Errorf("Publish with %s: %v, want an error wrapping outbox.ErrInvalidEvent", b.name, err)
			}
		}
		if f.PublishNilTx == nil {
			t.Error("the fixture has no PublishNilTx")
		} else if err := f.PublishNilTx(ctx, outbox.New(Note{})); !errors.Is(err, outbox.ErrNotInTransaction) {
			t.Errorf("Publish with a typed-nil transaction: %v, want outbox.ErrNotInTransaction", err)
		}
		expectPending(t, f, 0)

		// What every transport carries goes through untouched.
		odd := outbox.New(Note{Text: "ünïcödé"}, outbox.WithKey("a key with spaces · ü"),
			outbox.WithHeader("x-tab", "a\tb"), outbox.WithHeader("x-ü", "€"))
		mustPublish(t, f, true, odd)
		q := outboxmemory.New(nil)
		drain(t, f.Store, q, 1)
		want, _ := odd.Encode()
		if err := SameMessage(q.Sent()[0], want); err != nil {
			t.Error(err)
		}
	})

	t.Run("UnreadableRowIsDeadLetteredAlone", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		needSQL(t, f.SQL)
		a1 := outbox.New(Note{Text: "a1"}, outbox.WithKey("a"))
		a2 := outbox.New(Note{Text: "a2"}, outbox.WithKey("a"), outbox.WithHeader("h", "v"))
		a3 := outbox.New(Note{Text: "a3"}, outbox.WithKey("a"))
		b1 := outbox.New(Note{Text: "b1"}, outbox.WithKey("b"))
		c1 := outbox.New(Note{Text: "c1"})
		c2 := outbox.New(Note{Text: "c2"})
		c3 := outbox.New(Note{Text: "c3"})
		mustPublish(t, f, true, a1, a2, a3, b1, c1, c2, c3)
		// Each spoiled row: its event, the SQL that spoils it, the problem's words in the
		// reason, and where its raw value must be kept.
		type spoil struct {
			id     uuid.UUID
			set    string
			reason string
			raw    func(r *deadletter.Raw) string
			rawHas string
		}
		rawID := func(r *deadletter.Raw) string { return r.ID }
		rawHeaders := func(r *deadletter.Raw) string { return r.HeadersText }
		rawCreated := func(r *deadletter.Raw) string { return r.CreatedAt }
		rawType := func(r *deadletter.Raw) string { return r.Type }
		rawKey := func(r *deadletter.Raw) string { return r.Key }
		emptyType := spoil{c3.ID, "type = ''", "type is empty", rawType, ""}
		spoils := map[string][]spoil{
			"postgres": {
				{a2.ID, `headers = '{"n": 1}'`, "column headers", rawHeaders, `"n": 1`},
				{c2.ID, "key = ' padded '", "white space", rawKey, " padded "},
				emptyType,
			},
			"mysql": {
				{a2.ID, "id = 'not-a-uuid'", "column id", rawID, "not-a-uuid"},
				{c2.ID, `headers = '{"n": 1}'`, "column headers", rawHeaders, `"n": 1`},
				emptyType,
			},
			"sqlite": {
				{a2.ID, "id = 'not-a-uuid'", "column id", rawID, "not-a-uuid"},
				{c2.ID, "created_at = 'yesterday', headers = '{broken'", "column created_at", rawCreated, "yesterday"},
				emptyType,
			},
		}[f.SQL.Dialect]
		if spoils == nil {
			t.Skipf("no spoiling SQL for dialect %q", f.SQL.Dialect)
		}
		for _, s := range spoils {
			f.SQL.exec(t, "UPDATE "+f.SQL.Outbox+" SET "+s.set+" WHERE id = '"+s.id.String()+"'")
		}
		if f.SQL.Dialect == "postgres" { // some drivers cannot read it: the table refuses it
			if err := f.SQL.Exec(ctx, "UPDATE "+f.SQL.Outbox+" SET created_at = 'infinity' WHERE id = '"+c1.ID.String()+"'"); err == nil {
				t.Error("the outbox accepted created_at = 'infinity'")
			}
		}

		q := outboxmemory.New(nil)
		// SkipKey: the row is dead-lettered alone and its key's later events go on
		// (UnreadableRowHoldsItsKey is the default's test).
		r := newRelay(t, f.Store, q, skipKey(fastRelay("unreadable", 10)))
		drainOutbox(t, f, r, "a spoiled row failed the claim")
		sent := ids(q.Sent())
		for _, e := range []outbox.Event[Note]{a1, a3, b1, c1} {
			if !sent[e.ID] {
				t.Errorf("event %s was not delivered", e.Payload.Text)
			}
		}
		CheckPerKeyOrder(t, []outbox.Encodable{a1, a3, b1, c1}, q.Sent())
		if len(q.Sent()) != 4 {
			t.Errorf("%d messages sent, want the 4 readable ones", len(q.Sent()))
		}
		dl, err := f.DeadLetterTable.List(ctx, deadletter.Filter{Stage: deadletter.StageRelay, Kind: deadletter.KindUnreadableRow})
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != len(spoils) {
			t.Fatalf("%d unreadable-row dead letters, want %d: %+v", len(dl), len(spoils), dl)
		}
		for _, s := range spoils {
			var e *deadletter.Entry
			for i := range dl {
				if bytes.Contains([]byte(dl[i].Reason), []byte(s.reason)) {
					e = &dl[i]
				}
			}
			if e == nil {
				t.Errorf("no dead letter's reason names %q: %+v", s.reason, dl)
				continue
			}
			if e.Raw == nil || !strings.Contains(s.raw(e.Raw), s.rawHas) {
				t.Errorf("dead letter %q keeps raw %+v, want %q in it", e.Reason, e.Raw, s.rawHas)
			}
			if s.set == "id = 'not-a-uuid'" && e.Message.ID != uuid.Nil {
				t.Errorf("a row whose id is not a UUID got event ID %s", e.Message.ID)
			}
			if s.set != "id = 'not-a-uuid'" && e.Message.ID != s.id {
				t.Errorf("dead letter %q has event ID %s, want %s", e.Reason, e.Message.ID, s.id)
			}
			if err := f.DeadLetterTable.Replay(ctx, e.ID); !errors.Is(err, deadletter.ErrNotReplayable) {
				t.Errorf("replaying an unreadable row: %v, want deadletter.ErrNotReplayable", err)
			}
		}
	})

	t.Run("RelayDeadLettersStoreAnyReason", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		// A broker's error text may hold anything: the Retry and the DeadLetter write-backs
		// must store it anyway.
		weird := nastyText("broker says ") + strings.Repeat("x", 70_000)
		retried := outbox.New(Poison{1}, outbox.WithKey("k"))
		large := outbox.New(Note{Text: "large"})
		gaveUp := outbox.New(Note{Text: "gave up"})
		mustPublish(t, f, true, retried, large, gaveUp)
		var mu sync.Mutex
		calls := map[uuid.UUID]int{}
		q := outboxmemory.New(&outboxmemory.Config{SendHook: func(m outbox.Message) error {
			mu.Lock()
			defer mu.Unlock()
			calls[m.ID]++
			switch {
			case m.ID == large.ID:
				return fmt.Errorf("%s: %w", weird, outbox.ErrTooLarge)
			case m.ID == gaveUp.ID:
				return errors.New(weird)
			case calls[m.ID] == 1:
				return errors.New(weird)
			}
			return outbox.Permanent(errors.New(weird))
		}})
		r := newRelay(t, f.Store, q, skipKey(fastRelay("reasons", 3))) // the outbox drains
		drainOutbox(t, f, r, "a write-back failed on the error text")
		want := map[uuid.UUID]deadletter.Kind{retried.ID: deadletter.KindPermanent, large.ID: deadletter.KindTooLarge, gaveUp.ID: deadletter.KindGaveUp}
		for id, kind := range want {
			dl, err := f.DeadLetterTable.List(ctx, deadletter.Filter{EventID: id})
			if err != nil {
				t.Fatal(err)
			}
			if len(dl) != 1 {
				t.Fatalf("%d dead letters for %s, want 1", len(dl), id)
			}
			e := dl[0]
			if e.Kind != kind || e.Stage != deadletter.StageRelay {
				t.Errorf("dead letter of %s: kind %q stage %q, want %q relay", id, e.Kind, e.Stage, kind)
			}
			_, maxBytes := columnLimits(f.SQL)
			expectStorable(t, "reason", e.Reason, 0, maxBytes)
			if e.Raw == nil || !strings.Contains(e.Raw.Reason, weird) {
				t.Error("the raw column lost the original reason")
			}
		}
	})

	t.Run("DeadLetterTableRefusingContentGetsMinimalEntry", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		needSQL(t, f.SQL)
		const refused = "outboxtest.refused"
		f.SQL.refuse(t, refused)
		// Add, as the consumer writes.
		body := []byte(`{"kept":true}`)
		err := f.DeadLetterTable.Add(ctx, deadletter.Entry{
			Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: refused, Key: "k", ContentType: "application/json", Body: body},
			Stage:   deadletter.StageConsumer, Kind: deadletter.KindUnknownType, Consumer: "c", Reason: "no handler", Attempts: 1,
		})
		if err != nil {
			t.Fatalf("Add of an entry the table refuses: %v, want the minimal entry stored", err)
		}
		// The relay's write-back.
		e := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: refused, Key: "k2", ContentType: "application/json", Body: body}
		mustPublish(t, f, true, e)
		q := outboxmemory.New(&outboxmemory.Config{SendHook: func(outbox.Message) error { return outbox.Permanent(errors.New("rejected")) }})
		r := newRelay(t, f.Store, q, skipKey(fastRelay("refused", 3))) // the outbox drains
		drainOutbox(t, f, r, "the write-back of a row the table refuses")
		dl, err := f.DeadLetterTable.List(ctx, deadletter.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != 2 {
			t.Fatalf("%d dead letters, want 2", len(dl))
		}
		for _, d := range dl {
			if d.Message.Type == refused || d.Raw == nil || d.Raw.Type != refused || !strings.Contains(d.Reason, "refused") {
				t.Errorf("want a minimal entry with the original in Raw, got type %q reason %q raw %+v", d.Message.Type, d.Reason, d.Raw)
				continue
			}
			if got := d.Raw.Body; !bytes.Equal(got, body) && !bytes.Equal(d.Message.Body, body) {
				t.Errorf("the body was lost: raw %q, column %q", got, d.Message.Body)
			}
		}
	})

	t.Run("DeadLetterReadersSurviveSpoiledRows", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		needSQL(t, f.SQL)
		cols := "(event_id, event_type, headers, body, created_at, stage, reason, attempts, first_failed_at, last_failed_at)"
		now := f.SQL.now()
		rows := map[string][]string{
			"postgres": {`'` + uuid.NewString() + `', 'spoiled', '{"n": 1}', '', now(), 'relay', 'spoiled headers', 1, now(), now()`},
			"mysql":    {`'not-a-uuid', 'spoiled', '{"n": 1}', '', ` + now + `, 'relay', 'spoiled headers', 1, ` + now + `, ` + now},
			"sqlite":   {`'not-a-uuid', 'spoiled', '{broken', X'', 'yesterday', 'relay', 'spoiled headers', 1, ` + now + `, ` + now},
		}[f.SQL.Dialect]
		if rows == nil {
			t.Skipf("no spoiling SQL for dialect %q", f.SQL.Dialect)
		}
		for _, r := range rows {
			f.SQL.exec(t, "INSERT INTO "+f.SQL.DeadLetters+" "+cols+" VALUES ("+r+")")
		}
		if err := f.DeadLetterTable.Add(ctx, deadletter.Entry{Message: outbox.Message{ID: uuid.New(), Type: "fine"},
			Stage: deadletter.StageConsumer, Reason: "fine", Attempts: 1}); err != nil {
			t.Fatal(err)
		}
		dl, err := f.DeadLetterTable.List(ctx, deadletter.Filter{})
		if err != nil {
			t.Fatalf("List failed on a spoiled row: %v", err)
		}
		if len(dl) != 2 {
			t.Fatalf("listed %d dead letters, want 2", len(dl))
		}
		spoiled := dl[0]
		if spoiled.Raw == nil || spoiled.Raw.HeadersText == "" {
			t.Errorf("the spoiled headers are not in Raw.HeadersText: %+v", spoiled.Raw)
		}
		if _, err := f.DeadLetterTable.Get(ctx, spoiled.ID); err != nil {
			t.Errorf("Get failed on a spoiled row: %v", err)
		}
	})
}

// drainOutbox runs r until the outbox is empty; a relay cycle that fails fails the test
// with what, the failure it would be.
func drainOutbox(t *testing.T, f *StoreFixture, r *relay.Relay, what string) {
	t.Helper()
	ctx := context.Background()
	WaitFor(t, 30*time.Second, "the outbox to drain", func() bool {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		n, err := f.Pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// exercisePoisonConsumer runs the consumer side: a dead letter is stored whatever its
// content, a malformed message keeps everything that arrived, and every dead letter is
// classified, found by filter and refused by Replay when it cannot be rebuilt.
func exercisePoisonConsumer[TTx any](t *testing.T, newFixture func(t *testing.T) *IdempotencyFixture[TTx]) {
	ctx := context.Background()

	t.Run("AnyDeadLetterIsStored", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		created := time.Date(500, 1, 2, 3, 4, 5, 0, time.UTC) // before MySQL's DATETIME range
		in := deadletter.Entry{
			Message: outbox.Message{
				ID: uuid.Must(uuid.NewV7()), Type: nastyText("type"), Key: nastyText("key"),
				Headers:     map[string]string{nastyText("name"): nastyText("value"), "plain": "ok"},
				ContentType: nastyText("application/json"), Body: []byte("body\x00\xff"), CreatedAt: created,
			},
			Stage: deadletter.StageConsumer, Kind: deadletter.KindUnknownType, Consumer: nastyText("consumer"),
			Reason: nastyText("reason") + strings.Repeat("r", 70_000), Attempts: 2, BrokerMessageID: nastyText("broker"),
		}
		if err := f.DeadLetters.Add(ctx, in); err != nil {
			t.Fatalf("Add: %v", err)
		}
		dl, err := f.DeadLetters.List(ctx, deadletter.Filter{EventID: in.Message.ID})
		if err != nil || len(dl) != 1 {
			t.Fatalf("List: %d entries, %v", len(dl), err)
		}
		got := dl[0]
		maxChars, maxBytes := columnLimits(f.SQL)
		for field, v := range map[string]string{"type": got.Message.Type, "key": got.Message.Key,
			"content type": got.Message.ContentType, "consumer": got.Consumer, "broker message ID": got.BrokerMessageID} {
			expectStorable(t, field, v, maxChars, 0)
		}
		expectStorable(t, "reason", got.Reason, 0, maxBytes)
		for k, v := range got.Message.Headers {
			expectStorable(t, "header name", k, 0, 0)
			expectStorable(t, "header value", v, 0, 0)
		}
		if got.Message.Headers["plain"] != "ok" || !bytes.Equal(got.Message.Body, in.Message.Body) || got.Attempts != 2 {
			t.Errorf("what needed no change changed: headers %q, body %q, attempts %d", got.Message.Headers, got.Message.Body, got.Attempts)
		}
		r := got.Raw
		if r == nil {
			t.Fatal("no Raw: the originals are lost")
		}
		if r.Type != in.Message.Type || r.Key != in.Message.Key || r.ContentType != in.Message.ContentType ||
			r.Consumer != in.Consumer || r.Reason != in.Reason || r.BrokerMessageID != in.BrokerMessageID ||
			!maps.Equal(r.Headers, in.Message.Headers) {
			t.Error("Raw does not hold the originals byte for byte")
		}
		// A time the table cannot hold (MySQL's DATETIME starts in year 1000) goes to Raw.
		if !got.Message.CreatedAt.Equal(created) && r.CreatedAt != created.Format(time.RFC3339Nano) {
			t.Errorf("created_at %v stored as %v and Raw.CreatedAt %q: the original is lost", created, got.Message.CreatedAt, r.CreatedAt)
		}
		if err := f.DeadLetters.Replay(ctx, got.ID); !errors.Is(err, deadletter.ErrNotReplayable) {
			t.Errorf("replaying an entry changed to be stored: %v, want deadletter.ErrNotReplayable", err)
		}

		// Through the consumer: an event type no column holds is dead-lettered once and
		// acknowledged, not re-queued forever.
		q := outboxmemory.New(nil)
		m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Type: nastyText("type"), Key: "k\x00\xff",
			Headers: map[string]string{"h\x00": "\xff"}, ContentType: "application/json", Body: []byte(`{}`)}
		if err := q.Send(ctx, []outbox.Message{m}); err != nil {
			t.Fatal(err)
		}
		runConsumer(t, f.DeadLetters, q, f.Idempotent(effectOf(f, succeed), nil), 1, func() bool { return q.Len() == 0 })
		dl, err = f.DeadLetters.List(ctx, deadletter.Filter{EventID: m.ID})
		if err != nil || len(dl) != 1 || dl[0].Attempts != 1 || dl[0].Kind != deadletter.KindUnknownType || dl[0].Raw == nil || dl[0].Raw.Type != m.Type {
			t.Fatalf("the poison message has %d dead letters (%v); want one, kind unknown-type, at attempt 1, the type in Raw", len(dl), err)
		}
	})

	t.Run("MalformedMessageKeepsItsContent", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		body := []byte("{not json\x00\xff")
		attrs := map[string]string{"ce-id": "not a uuid", "ce-type": "orders.placed\x00", "ce-specversion": "1.0", "x-odd\xff": "v\x00"}
		noID := &outbox.MalformedError{
			Partial:         outbox.Message{Type: "orders.placed", Key: "k", Body: body},
			BrokerMessageID: "broker-" + uuid.NewString(),
			Attributes:      attrs, Body: body,
			Err: errors.New("ce-id is not a UUID"),
		}
		partialID := uuid.Must(uuid.NewV7())
		withID := &outbox.MalformedError{
			Partial:         outbox.Message{ID: partialID, Type: Note{}.EventType(), ContentType: "application/json", Body: []byte(`{"text":"x"}`)},
			BrokerMessageID: "broker-" + uuid.NewString(),
			Attributes:      map[string]string{"ce-id": partialID.String()}, Body: []byte("base64:eyJ0ZXh0IjoieCJ9"),
			Err: errors.New("ce-time is not a time"),
		}
		plainErr := errors.New("an old transport's error without MalformedError")
		r := &scriptedReceiver{ds: []*scriptedDelivery{{err: noID}, {err: withID}, {err: plainErr}}}
		runConsumer(t, f.DeadLetters, r, f.Idempotent(effectOf(f, succeed), nil), 3, r.settled)
		if r.nacked() {
			t.Error("a malformed message was nacked: it would come back forever")
		}

		all, err := f.DeadLetters.List(ctx, deadletter.Filter{Kind: deadletter.KindMalformed})
		if err != nil || len(all) != 3 {
			t.Fatalf("%d malformed dead letters (%v), want 3", len(all), err)
		}
		byBroker := func(id string) deadletter.Entry {
			t.Helper()
			dl, err := f.DeadLetters.List(ctx, deadletter.Filter{BrokerMessageID: id})
			if err != nil || len(dl) != 1 {
				t.Fatalf("Filter by broker message ID %s: %d entries, %v", id, len(dl), err)
			}
			return dl[0]
		}
		e := byBroker(noID.BrokerMessageID)
		if e.Message.ID != uuid.Nil {
			t.Errorf("a message without a readable ID got event ID %s", e.Message.ID)
		}
		if e.Message.Type != "orders.placed" || e.Message.Key != "k" || e.Stage != deadletter.StageConsumer || !strings.Contains(e.Reason, "ce-id is not a UUID") {
			t.Errorf("what could be read was not kept: %+v", e)
		}
		body2 := e.Message.Body
		if e.Raw != nil && e.Raw.Body != nil {
			body2 = e.Raw.Body
		}
		if e.Raw == nil || !maps.Equal(e.Raw.Attributes, attrs) || !bytes.Equal(body2, body) {
			t.Errorf("the attributes and body as received were not kept: %+v", e.Raw)
		}
		if err := f.DeadLetters.Replay(ctx, e.ID); !errors.Is(err, deadletter.ErrNotReplayable) {
			t.Errorf("replaying a malformed message: %v, want deadletter.ErrNotReplayable", err)
		}

		w := byBroker(withID.BrokerMessageID)
		if w.Message.ID != partialID || w.Raw == nil || !bytes.Equal(w.Raw.Body, withID.Body) {
			t.Errorf("a partly read message lost its ID or its raw body: %+v", w)
		}
		if dl, err := f.DeadLetters.List(ctx, deadletter.Filter{EventID: partialID}); err != nil || len(dl) != 1 {
			t.Errorf("Filter by event ID: %d entries, %v", len(dl), err)
		}
		if err := f.DeadLetters.Replay(ctx, w.ID); !errors.Is(err, deadletter.ErrNotReplayable) {
			t.Errorf("replaying a malformed message: %v, want deadletter.ErrNotReplayable", err)
		}
		if dl, err := f.DeadLetters.List(ctx, deadletter.Filter{ReasonContains: "without MalformedError"}); err != nil || len(dl) != 1 || dl[0].Kind != deadletter.KindMalformed {
			t.Errorf("Filter by reason text: %+v, %v", dl, err)
		}
	})

	t.Run("DeadLettersAreClassified", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		q := outboxmemory.New(nil)
		unknown, _ := outbox.New(Poison{1}).Encode()
		undecodable, _ := outbox.New(Note{Text: "bad body"}).Encode()
		undecodable.Body = []byte("{broken")
		permanent, _ := outbox.New(Note{Text: "permanent"}).Encode()
		gaveUp, _ := outbox.New(Note{Text: "gave up"}).Encode()
		if err := q.Send(ctx, []outbox.Message{unknown, undecodable, permanent, gaveUp}); err != nil {
			t.Fatal(err)
		}
		h := f.Idempotent(effectOf(f, func(e outbox.Event[Note]) error {
			switch e.Payload.Text {
			case "permanent":
				return outbox.Permanent(errors.New("handler refuses"))
			case "gave up":
				return errors.New("still failing")
			}
			return nil
		}), nil)
		runConsumer(t, f.DeadLetters, q, h, 4, func() bool { return q.Len() == 0 })
		for id, kind := range map[uuid.UUID]deadletter.Kind{
			unknown.ID: deadletter.KindUnknownType, undecodable.ID: deadletter.KindUndecodable,
			permanent.ID: deadletter.KindPermanent, gaveUp.ID: deadletter.KindGaveUp,
		} {
			dl, err := f.DeadLetters.List(ctx, deadletter.Filter{Kind: kind, Consumer: "outboxtest"})
			if err != nil || len(dl) != 1 || dl[0].Message.ID != id {
				t.Errorf("Filter by kind %s: %+v, %v; want event %s alone", kind, dl, err, id)
			}
		}
	})
}

// scriptedReceiver delivers its deliveries once each, then nothing.
type scriptedReceiver struct {
	mu   sync.Mutex
	ds   []*scriptedDelivery
	next int // the first delivery not received yet
}

func (r *scriptedReceiver) Receive(ctx context.Context, max int) ([]outbox.Delivery, error) {
	r.mu.Lock()
	if r.next < len(r.ds) {
		var out []outbox.Delivery
		for ; r.next < len(r.ds) && len(out) < max; r.next++ {
			d := r.ds[r.next]
			d.r = r
			out = append(out, d)
		}
		r.mu.Unlock()
		return out, nil
	}
	r.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(5 * time.Millisecond):
		return nil, nil
	}
}

func (r *scriptedReceiver) settled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.ds {
		if !d.acked && !d.nack {
			return false
		}
	}
	return true
}

func (r *scriptedReceiver) nacked() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.ds {
		if d.nack {
			return true
		}
	}
	return false
}

// scriptedDelivery is a delivery whose Message fails with err.
type scriptedDelivery struct {
	r           *scriptedReceiver
	err         error
	acked, nack bool
}

func (d *scriptedDelivery) Message() (outbox.Message, error) { return outbox.Message{}, d.err }
func (d *scriptedDelivery) Attempt() int                     { return 1 }
func (d *scriptedDelivery) Ack(context.Context) error {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	d.acked = true
	return nil
}

func (d *scriptedDelivery) Nack(context.Context, time.Duration) error {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	d.nack = true
	return nil
}
