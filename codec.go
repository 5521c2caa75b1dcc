package outbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/txoutbox/outbox/internal/mediatype"
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

// RegisterCodec makes c available to [Decode] for messages of its content type. Content
// types are compared as media types: case and parameters do not matter, so a codec for
// "application/json" also decodes "Application/JSON; charset=utf-8".
func RegisterCodec(c Codec) {
	ct := c.ContentType()
	if mt := mediatype.Base(ct); mt != "" {
		ct = mt
	}
	codecs.Store(ct, c)
}

// codecFor returns the codec of a message's content type: the one registered for its media
// type, else, for a "+json" structured syntax suffix (application/vnd.acme.order+json), the
// one registered for application/json. An empty content type means JSON.
func codecFor(contentType string) (Codec, error) {
	if contentType == "" {
		return JSON, nil
	}
	if c, ok := codecs.Load(contentType); ok { // the common case: exactly as registered
		return c.(Codec), nil
	}
	mt := mediatype.Base(contentType)
	if c, ok := codecs.Load(mt); ok && mt != "" {
		return c.(Codec), nil
	}
	if strings.HasSuffix(mt, "+json") {
		if c, ok := codecs.Load("application/json"); ok {
			return c.(Codec), nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownContentType, contentType)
}
