package outbox_test

import (
	"fmt"

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
