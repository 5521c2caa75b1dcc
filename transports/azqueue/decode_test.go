package outboxazqueue

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"github.com/txoutbox/outbox"
)

// TestMalformedKeepsOneCopy: the error of a malformed message holds the text as received
// without copying it, and a document that is the text itself (Text encoding) is a slice of
// it, so a consumer holding malformed deliveries holds each text once.
func TestMalformedKeepsOneCopy(t *testing.T) {
	for _, text := range []string{
		`{"specversion":"1.0","id":"x"`,         // a JSON document cut short
		"  " + `{"specversion":"0.3","id":"x"}`, // an older CloudEvent
		"not a CloudEvent, nor base64",
	} {
		raw := []byte(text)
		_, err := decode("msg-1", raw)
		var me *outbox.MalformedError
		if !errors.As(err, &me) {
			t.Fatalf("decode(%q) = %v, want a MalformedError", text, err)
		}
		if !bytes.Equal(me.Body, raw) || unsafe.SliceData(me.Body) != unsafe.SliceData(raw) {
			t.Errorf("decode(%q): MalformedError.Body is a copy of the text, want the text itself", text)
		}
		if p := me.Partial.Body; len(p) > 0 && !within(p, raw) {
			t.Errorf("decode(%q): MalformedError.Partial.Body %q is a copy, want a slice of the text", text, p)
		}
	}
}

// within reports whether b lies in the memory of s.
func within(b, s []byte) bool {
	start, end := uintptr(unsafe.Pointer(unsafe.SliceData(s))), uintptr(unsafe.Pointer(unsafe.SliceData(s)))+uintptr(len(s))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p+uintptr(len(b)) <= end
}
