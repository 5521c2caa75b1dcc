package outbox_test

import (
	"encoding/xml"
	"fmt"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
)

// ParseRequested asks a worker to parse an uploaded file.
type ParseRequested struct {
	TaskID       string `json:"task_id"`
	SourceFileID string `json:"source_file_id"`
}

// EventType names the event on the wire; it is stored, never derived by reflection.
func (ParseRequested) EventType() string { return "files.parse_requested" }

func ExampleNew() {
	e := outbox.New(ParseRequested{TaskID: "t-1", SourceFileID: "f-9"}, outbox.WithKey("f-9"))
	m, err := e.Encode()
	if err != nil {
		panic(err)
	}
	fmt.Println(m.Type, m.Key, m.ContentType, string(m.Body))
	fmt.Println("ID is a UUIDv7:", m.ID.Version() == 7)
	// Output:
	// files.parse_requested f-9 application/json {"task_id":"t-1","source_file_id":"f-9"}
	// ID is a UUIDv7: true
}

func ExampleDecode() {
	m, _ := outbox.New(ParseRequested{TaskID: "t-1"}).Encode()
	e, err := outbox.Decode[ParseRequested](m)
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Payload.TaskID, e.ID == m.ID)
	// Output: t-1 true
}

// Options set the event's key (its order: events with one key are delivered and handled in
// the order they were written), its headers, and its ID when it must be derived from
// something else (an idempotency key of the request that made it).
func ExampleNew_options() {
	e := outbox.New(ParseRequested{TaskID: "t-1", SourceFileID: "f-9"},
		outbox.WithKey("f-9"),
		outbox.WithHeader("tenant", "acme"),
		outbox.WithID(uuid.MustParse("01890f4e-7b2a-7c3d-8e4f-a1b2c3d4e5f6")),
	)
	m, err := e.Encode()
	if err != nil {
		panic(err)
	}
	fmt.Println(m.ID, m.Type, m.Key, m.Headers["tenant"])
	// Output: 01890f4e-7b2a-7c3d-8e4f-a1b2c3d4e5f6 files.parse_requested f-9 acme
}

// xmlCodec encodes payloads as XML.
type xmlCodec struct{}

func (xmlCodec) ContentType() string                { return "application/xml" }
func (xmlCodec) Marshal(v any) ([]byte, error)      { return xml.Marshal(v) }
func (xmlCodec) Unmarshal(data []byte, v any) error { return xml.Unmarshal(data, v) }

// A payload in another format than JSON: the producer picks the codec per event, and the
// content type travels with the message, so the consumer's Decode picks the same codec once
// it is registered.
func ExampleWithCodec() {
	outbox.RegisterCodec(xmlCodec{}) // on the consumer's side, once, at start-up

	m, err := outbox.New(ParseRequested{TaskID: "t-1"}, outbox.WithCodec(xmlCodec{})).Encode()
	if err != nil {
		panic(err)
	}
	fmt.Println(m.ContentType, string(m.Body))
	e, err := outbox.Decode[ParseRequested](m)
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Payload.TaskID)
	// Output:
	// application/xml <ParseRequested><TaskID>t-1</TaskID><SourceFileID></SourceFileID></ParseRequested>
	// t-1
}
