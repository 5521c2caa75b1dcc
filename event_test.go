package outbox_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
)

type badPayload struct{ F func() }

func (badPayload) EventType() string { return "bad" }

type unnamed struct{}

func (unnamed) EventType() string { return "" }

func TestEncodeErrors(t *testing.T) {
	_, err := outbox.New(badPayload{F: func() {}}).Encode()
	var ee *outbox.EncodeError
	if !errors.As(err, &ee) || ee.Type != "bad" {
		t.Fatalf("unencodable payload: %v, want *EncodeError", err)
	}
	if _, err := outbox.New(unnamed{}).Encode(); err == nil {
		t.Fatal("a payload with an empty EventType encoded")
	}
	if _, err := (outbox.Event[ParseRequested]{}).Encode(); err == nil {
		t.Fatal("an event without an ID encoded")
	}
}

func TestDecodeErrors(t *testing.T) {
	m, _ := outbox.New(ParseRequested{TaskID: "t"}).Encode()
	if _, err := outbox.Decode[badPayload](m); !errors.Is(err, outbox.ErrTypeMismatch) {
		t.Fatalf("wrong type: %v", err)
	}
	m.Body = []byte("{not json")
	var de *outbox.DecodeError
	if _, err := outbox.Decode[ParseRequested](m); !errors.As(err, &de) {
		t.Fatalf("bad body: %v", err)
	}
	m.ContentType = "application/x-unknown"
	if _, err := outbox.Decode[ParseRequested](m); !errors.Is(err, outbox.ErrUnknownContentType) {
		t.Fatalf("unknown content type: %v", err)
	}
}

func TestOptions(t *testing.T) {
	e := outbox.New(ParseRequested{}, outbox.WithKey("k"), outbox.WithHeaders(map[string]string{"a": "1"}), outbox.WithHeader("b", "2"))
	if e.Key != "k" || e.Headers["a"] != "1" || e.Headers["b"] != "2" || time.Since(e.CreatedAt) > time.Minute {
		t.Fatalf("options not applied: %+v", e)
	}
	other := outbox.New(ParseRequested{})
	if other.ID == e.ID || other.ID.Version() != 7 {
		t.Fatal("IDs must be fresh UUIDv7s")
	}
}

func TestBackoff(t *testing.T) {
	for attempt := 1; attempt < 40; attempt++ {
		d := backoff.Delay(attempt, time.Second, time.Minute)
		want := min(time.Second<<min(attempt-1, 30), time.Minute)
		if d < want/2 || d > want {
			t.Fatalf("attempt %d: backoff %v outside [%v, %v]", attempt, d, want/2, want)
		}
	}
}

func TestRelayConfigValidation(t *testing.T) {
	_, err := relay.New(nil, nil, &relay.Config{BatchSize: -1, Lease: time.Second, SendTimeout: time.Second})
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"Store", "Sender", "BatchSize", "SendTimeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// valueType has a value-receiver EventType, so a nil *valueType cannot call it.
type valueType struct{ N int }

func (valueType) EventType() string { return "value.type" }

// TestNilPointerPayloadsNeverPanic: a nil *T payload fails Encode with ErrInvalidEvent, an
// EventType that panics too, and a pointer type with a value-receiver EventType works for
// EventTypeOf and Decode.
func TestNilPointerPayloadsNeverPanic(t *testing.T) {
	e := outbox.New[*valueType](nil)
	if _, err := e.Encode(); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("Encode of a nil pointer payload: %v, want ErrInvalidEvent", err)
	}
	if e.Type() != "" {
		t.Fatalf("Type of a nil pointer payload = %q, want \"\"", e.Type())
	}
	if _, err := outbox.New(panicky{}).Encode(); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("Encode with a panicking EventType: %v", err)
	}
	if typ, err := outbox.EventTypeOf[*valueType](); err != nil || typ != "value.type" {
		t.Fatalf("EventTypeOf[*valueType] = %q, %v", typ, err)
	}
	if _, err := outbox.EventTypeOf[panicky](); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("EventTypeOf[panicky]: %v", err)
	}
	m, err := outbox.New(&valueType{N: 7}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := outbox.Decode[*valueType](m)
	if err != nil || got.Payload == nil || got.Payload.N != 7 {
		t.Fatalf("Decode[*valueType] = %+v, %v", got, err)
	}
}

type panicky struct{}

func (panicky) EventType() string { panic("no type") }

// TestValidateNamesEveryProblem: Validate lists each rule a message breaks, and accepts what
// every transport carries.
func TestValidateNamesEveryProblem(t *testing.T) {
	m := outbox.Message{Type: "a\x01", Key: " k", ContentType: "x\n",
		Headers: map[string]string{"": "v", "n": "\xff", "t": "a\tb"}}
	err := m.Validate()
	if !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("Validate: %v", err)
	}
	for _, want := range []string{"no ID", "type", "white space", "content type", "empty name", "not valid UTF-8"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `"t"`) {
		t.Errorf("a tab in a header value was refused: %v", err)
	}
	ok, _ := outbox.New(ParseRequested{}, outbox.WithKey("ünï code"), outbox.WithHeader("x-€", "a\tb")).Encode()
	if err := ok.Validate(); err != nil {
		t.Fatalf("a carriable message was refused: %v", err)
	}
}
