package deadletter_test

import (
	"fmt"

	"github.com/txoutbox/outbox/deadletter"
)

// A dead letter's raw column, read with plain SQL (SELECT raw FROM outbox_dead_letters …),
// decodes with UnmarshalText; Table.List and Get return it decoded in Entry.Raw.
func ExampleRaw_UnmarshalText() {
	column := []byte("txoutbox-raw/1\n" +
		"type: \"orders.placed\\x00\"\n" +
		"attribute \"ce-id\": \"not a uuid\"\n" +
		"\n" +
		"{\"order\":42}")
	var raw deadletter.Raw
	if err := raw.UnmarshalText(column); err != nil {
		panic(err)
	}
	fmt.Printf("type %q, ce-id %q, body %s\n", raw.Type, raw.Attributes["ce-id"], raw.Body)
	// Output: type "orders.placed\x00", ce-id "not a uuid", body {"order":42}
}
