package outbox_test

import (
	"errors"
	"testing"

	"github.com/txoutbox/outbox"
)

type upperCodec struct{}

func (upperCodec) ContentType() string           { return "Text/X-Upper; charset=utf-8" }
func (upperCodec) Marshal(v any) ([]byte, error) { return []byte(v.(ParseRequested).TaskID), nil }
func (upperCodec) Unmarshal(data []byte, v any) error {
	v.(*ParseRequested).TaskID = string(data)
	return nil
}

// TestDecodeMatchesMediaTypes: a codec is found by media type, whatever the case and the
// parameters (what other CloudEvents SDKs send, such as the JS SDK's
// "application/json; charset=utf-8"), and +json types decode with the JSON codec.
func TestDecodeMatchesMediaTypes(t *testing.T) {
	t.Parallel()
	outbox.RegisterCodec(upperCodec{})
	m, err := outbox.New(ParseRequested{TaskID: "t1"}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range []string{
		"",
		"application/json",
		"application/json; charset=utf-8",
		"Application/JSON;charset=UTF-8",
		"application/json; charset", // a broken parameter does not hide the type
		"application/vnd.acme.parse+json",
		"application/cloudevents+json; charset=utf-8",
	} {
		m.ContentType = ct
		e, err := outbox.Decode[ParseRequested](m)
		if err != nil || e.Payload.TaskID != "t1" {
			t.Errorf("content type %q: %+v, %v", ct, e.Payload, err)
		}
	}
	for _, ct := range []string{"text/x-upper", "TEXT/X-UPPER; charset=latin1"} {
		m.ContentType, m.Body = ct, []byte("t2")
		if e, err := outbox.Decode[ParseRequested](m); err != nil || e.Payload.TaskID != "t2" {
			t.Errorf("content type %q: %+v, %v", ct, e.Payload, err)
		}
	}
	for _, ct := range []string{"application/x-protobuf", "application/jsonl", "not a media type"} {
		m.ContentType = ct
		if _, err := outbox.Decode[ParseRequested](m); !errors.Is(err, outbox.ErrUnknownContentType) {
			t.Errorf("content type %q: %v, want ErrUnknownContentType", ct, err)
		}
	}
}
