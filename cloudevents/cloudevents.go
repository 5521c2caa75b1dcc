// Package outboxce is txoutbox's wire format: CloudEvents 1.0 in binary mode (attributes
// as broker headers, the payload as the body) for brokers with headers, and in structured
// JSON mode for brokers without them. Every transport encodes and decodes through here, so a
// consumer in any language reads our messages with its own CloudEvents SDK, and a transport
// written outside this repository speaks the same format by importing it.
//
// Mapping: id ← Message.ID, type ← Message.Type, time ← Message.CreatedAt (RFC 3339, UTC),
// datacontenttype ← Message.ContentType, extension partitionkey ← Message.Key. Each header
// whose name is a valid extension name (1–20 of a-z, 0-9: traceparent, tracestate…)
// becomes an extension attribute of that name; other headers travel together, as a JSON
// object, in the extension "txheaders".
package outboxce

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
)

// SpecVersion is the CloudEvents version we write.
const SpecVersion = "1.0"

// DefaultSource is the source attribute when a transport is not given one.
const DefaultSource = "/txoutbox"

// HeaderPrefix prefixes attribute names in binary mode ("ce-id").
const HeaderPrefix = "ce-"

// ContentTypeHeader carries datacontenttype in binary mode, as the HTTP/Kafka bindings do.
const ContentTypeHeader = "content-type"

const (
	extKey       = "partitionkey"
	extTxHeaders = "txheaders"
)

var extName = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

// reserved attribute names a header may not take over.
var reserved = map[string]bool{
	"id": true, "type": true, "source": true, "specversion": true, "time": true,
	"datacontenttype": true, "dataschema": true, "subject": true, "data": true,
	"data_base64": true, extKey: true, extTxHeaders: true,
}

// attrNames names the fixed attributes in one mode: unprefixed (structured) or as binary-mode
// headers, so the binary encoder uses constants instead of concatenating each message.
type attrNames struct {
	specversion, id, typ, source, time, datacontenttype, key, txheaders string
	prefix                                                              string // of extensions
}

var (
	plainNames  = attrNames{"specversion", "id", "type", "source", "time", "datacontenttype", extKey, extTxHeaders, ""}
	binaryNames = attrNames{HeaderPrefix + "specversion", HeaderPrefix + "id", HeaderPrefix + "type", HeaderPrefix + "source",
		HeaderPrefix + "time", ContentTypeHeader, HeaderPrefix + extKey, HeaderPrefix + extTxHeaders, HeaderPrefix}
)

// eachAttribute calls f with each context attribute of m (id, type, …, extensions), named
// as n says; every name is distinct. On error, f may have been called for some of them.
func eachAttribute(m outbox.Message, source string, n *attrNames, f func(name, value string)) error {
	if source == "" {
		source = DefaultSource
	}
	ct := m.ContentType
	if ct == "" {
		ct = outbox.JSON.ContentType()
	}
	f(n.specversion, SpecVersion)
	f(n.id, m.ID.String())
	f(n.typ, m.Type)
	f(n.source, source)
	f(n.time, m.CreatedAt.UTC().Format(time.RFC3339Nano))
	f(n.datacontenttype, ct)
	if m.Key != "" {
		f(n.key, m.Key)
	}
	var other map[string]string
	for k, v := range m.Headers {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("outbox: message %s: header %q is not valid UTF-8 and cannot travel as a CloudEvents attribute", m.ID, k)
		}
		if !reserved[k] && extName.MatchString(k) {
			f(n.prefix+k, v)
			continue
		}
		if other == nil {
			other = map[string]string{}
		}
		other[k] = v
	}
	if other != nil {
		b, err := json.Marshal(other)
		if err != nil {
			return err
		}
		f(n.txheaders, string(b))
	}
	return nil
}

// attributes returns m's context attributes without prefix (id, type, …, extensions).
func attributes(m outbox.Message, source string) (map[string]string, error) {
	a := make(map[string]string, 8+len(m.Headers))
	if err := eachAttribute(m, source, &plainNames, func(k, v string) { a[k] = v }); err != nil {
		return nil, err
	}
	return a, nil
}

// fromAttributes rebuilds a message from unprefixed attributes and a body.
func fromAttributes(a map[string]string, body []byte) (outbox.Message, error) {
	var errs []error
	if v := a["specversion"]; v != SpecVersion {
		errs = append(errs, fmt.Errorf("specversion %q, want %q", v, SpecVersion))
	}
	id, err := uuid.Parse(a["id"])
	if err != nil {
		errs = append(errs, fmt.Errorf("id %q is not a UUID", a["id"]))
	}
	if a["type"] == "" {
		errs = append(errs, errors.New("no type"))
	}
	var created time.Time
	if t := a["time"]; t != "" {
		if created, err = time.Parse(time.RFC3339Nano, t); err != nil {
			errs = append(errs, fmt.Errorf("time %q is not RFC 3339", t))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return outbox.Message{}, fmt.Errorf("%w: not a txoutbox CloudEvent: %w", outbox.ErrMalformed, err)
	}
	m := outbox.Message{
		ID:          id,
		Type:        a["type"],
		Key:         a[extKey],
		ContentType: a["datacontenttype"],
		Body:        body,
		CreatedAt:   created.UTC(),
	}
	for k, v := range a {
		if reserved[k] {
			continue
		}
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[k] = v
	}
	if raw := a[extTxHeaders]; raw != "" {
		var other map[string]string
		if err := json.Unmarshal([]byte(raw), &other); err != nil {
			return outbox.Message{}, fmt.Errorf("%w: extension %s is not a JSON object of strings", outbox.ErrMalformed, extTxHeaders)
		}
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		for k, v := range other {
			m.Headers[k] = v
		}
	}
	return m, nil
}

// ToBinary returns the broker headers of m in binary mode: "ce-"-prefixed attributes plus
// "content-type". The body is m.Body unchanged.
func ToBinary(m outbox.Message, source string) (map[string]string, error) {
	h := make(map[string]string, 8+len(m.Headers))
	if err := EachBinary(m, source, func(k, v string) { h[k] = v }); err != nil {
		return nil, err
	}
	return h, nil
}

// EachBinary calls set with each header ToBinary would return, without building the map,
// for a transport that fills its own header type. On error, set may have been called for
// some headers: discard them.
func EachBinary(m outbox.Message, source string, set func(name, value string)) error {
	return eachAttribute(m, source, &binaryNames, set)
}

// FromBinary rebuilds a message from binary-mode headers and body. Headers without the
// "ce-" prefix (other than content-type) are ignored. Errors wrap outbox.ErrMalformed.
func FromBinary(headers map[string]string, body []byte) (outbox.Message, error) {
	a := make(map[string]string, len(headers))
	for k, v := range headers {
		switch {
		case k == ContentTypeHeader || k == "Content-Type":
			a["datacontenttype"] = v
		case len(k) > len(HeaderPrefix) && k[:len(HeaderPrefix)] == HeaderPrefix:
			a[k[len(HeaderPrefix):]] = v
		}
	}
	return fromAttributes(a, body)
}

// ToStructured returns m as one structured-mode JSON document. A JSON payload is embedded
// as "data" byte for byte (no re-encoding, no HTML escaping; surrounding white space aside);
// any other payload is base64 in
// "data_base64".
func ToStructured(m outbox.Message, source string) ([]byte, error) {
	a, err := attributes(m, source)
	if err != nil {
		return nil, err
	}
	embed := a["datacontenttype"] == outbox.JSON.ContentType() && json.Valid(m.Body)
	if !embed {
		a["data_base64"] = base64.StdEncoding.EncodeToString(m.Body)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(a); err != nil {
		return nil, err
	}
	doc := bytes.TrimRight(buf.Bytes(), "\n")
	if !embed {
		return doc, nil
	}
	// Splice the payload in as the last member: {"id":…,"data":<body>}.
	out := make([]byte, 0, len(doc)+len(m.Body)+8)
	out = append(out, doc[:len(doc)-1]...)
	out = append(out, `,"data":`...)
	out = append(out, bytes.TrimSpace(m.Body)...)
	return append(out, '}'), nil
}

// FromStructured decodes a structured-mode JSON document. Errors wrap outbox.ErrMalformed.
func FromStructured(doc []byte) (outbox.Message, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(doc, &raw); err != nil {
		return outbox.Message{}, fmt.Errorf("%w: not a JSON CloudEvent: %w", outbox.ErrMalformed, err)
	}
	a := make(map[string]string, len(raw))
	var body []byte
	for k, v := range raw {
		switch k {
		case "data":
			body = []byte(v)
		case "data_base64":
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return outbox.Message{}, fmt.Errorf("%w: data_base64 is not a string", outbox.ErrMalformed)
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return outbox.Message{}, fmt.Errorf("%w: data_base64 is not base64: %w", outbox.ErrMalformed, err)
			}
			body = b
		default:
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return outbox.Message{}, fmt.Errorf("%w: attribute %q is not a string", outbox.ErrMalformed, k)
			}
			a[k] = s
		}
	}
	return fromAttributes(a, body)
}
