package outbox

import (
	"encoding/json"
	"fmt"
	"sync"
)

// Codec encodes payloads. The content type is stored with each event so a consumer picks the
// matching codec; register non-default codecs with [RegisterCodec] on the consumer side.
type Codec interface {
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default codec (encoding/json, content type application/json).
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) ContentType() string                { return "application/json" }
func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

var codecs sync.Map // content type → Codec

func init() { RegisterCodec(JSON) }

// RegisterCodec makes c available to [Decode] for messages of its content type.
func RegisterCodec(c Codec) { codecs.Store(c.ContentType(), c) }

func codecFor(contentType string) (Codec, error) {
	if contentType == "" {
		return JSON, nil
	}
	if c, ok := codecs.Load(contentType); ok {
		return c.(Codec), nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownContentType, contentType)
}
