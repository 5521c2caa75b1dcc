// Package cloudevents is txoutbox's wire format: CloudEvents 1.0 in binary mode (attributes
// as broker headers, the payload as the body) for brokers with headers, and in structured
// JSON mode for brokers without them. Every transport encodes and decodes through here, so a
// consumer in any language reads our messages with its own CloudEvents SDK, a transport
// written outside this repository speaks the same format by importing it, and events
// written by any CloudEvents producer reach txoutbox consumers. It is for authors of
// transports, and for readers of our messages in other languages; applications never call
// it.
//
// # Writing
//
// id ← Message.ID, type ← Message.Type, source ← the transport's configured source (or the
// [SourceHeader] header), time ← Message.CreatedAt (RFC 3339, UTC; left out when zero),
// datacontenttype ← Message.ContentType, extension partitionkey ← Message.Key, subject and
// dataschema ← the [SubjectHeader] and [DataSchemaHeader] headers. Each other header whose
// name is a valid extension name (1–20 of a-z, 0-9: traceparent, tracestate…) becomes an
// extension attribute of that name; the rest travel together, as a JSON object of strings,
// in the extension "txheaders". In binary mode an attribute is the header "ce-" + its name,
// and datacontenttype is "content-type". In structured mode a JSON payload is embedded as
// "data", any other as "data_base64".
//
// # Reading
//
// Decoding accepts any CloudEvents 1.0 event, not only ours:
//   - Binary-mode headers in any case ("ce-id", "Ce-Id", "CE-ID") and in the underscore
//     style of the Kafka binding and several SDKs ("ce_id"); "ce-" in lower case wins a clash.
//     Bare "partitionkey", "traceparent" and "tracestate" headers (what tracing
//     instrumentation and some producers write next to the "ce-" ones) set the key and the
//     trace context when there is no "ce-" attribute of that name. A message whose
//     content-type is application/cloudevents+json, or that has no CloudEvents headers and a
//     JSON object as its body, is read in structured mode.
//   - Structured-mode attributes of any CloudEvents type: strings as they are, integers and
//     booleans as their JSON text ("retrycount": 3 becomes the header retrycount="3"); null
//     means absent. "data" of a JSON content type (application/json, any "+json" type, with
//     any parameters, or none given) is the payload byte for byte; "data" that is a JSON
//     string under another content type is that string's text; "data_base64" is decoded.
//   - id: a UUID in its hyphenated form (any case) is the event ID as it is. Any other id —
//     CloudEvents allows any non-empty string, unique per source — gets the event ID
//     [EventID](source, id), a UUIDv5 that is the same every time the event arrives, so the
//     inbox and broker dedup work for it as for ours; the original id and source are kept in
//     the [IDHeader] and [SourceHeader] headers. Writing such a message writes them back as
//     id and source, so a forwarded or replayed foreign event stays the same event.
//   - time: RFC 3339 with upper- or lower-case "T" and "Z".
//   - subject and dataschema: in the [SubjectHeader] and [DataSchemaHeader] headers.
//
// A message that is not a valid event (no id, no type, a specversion other than 1.0, a
// time that is not RFC 3339, undecodable data) fails with an [*outbox.MalformedError]
// keeping what could be read; transports complete it with [Malformed].
package cloudevents

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/mediatype"
)

// SpecVersion is the CloudEvents version we write.
const SpecVersion = "1.0"

// DefaultSource is the source attribute when a transport is not given one.
const DefaultSource = "/txoutbox"

// HeaderPrefix prefixes attribute names in binary mode ("ce-id").
const HeaderPrefix = "ce-"

// ContentTypeHeader carries datacontenttype in binary mode, as the HTTP/Kafka bindings do.
const ContentTypeHeader = "content-type"

// StructuredContentType is the content type of a message carrying a whole event as one JSON
// document (structured mode) in a binding with headers.
const StructuredContentType = "application/cloudevents+json"

// Message headers that hold CloudEvents attributes without a field of their own in
// [outbox.Message]. The decoder sets them; the encoder writes them back as the attributes.
const (
	// IDHeader holds the event's original CloudEvents id when it is not the event ID as
	// is: an id that is not a UUID (the event ID is then [EventID] of source and id), or a
	// UUID not in lower case.
	IDHeader = "cloudevents-id"
	// SourceHeader holds the source of an event whose ID was derived from its id. When set,
	// it is written as the source attribute instead of the transport's source.
	SourceHeader = "cloudevents-source"
	// SubjectHeader holds the subject attribute.
	SubjectHeader = "cloudevents-subject"
	// DataSchemaHeader holds the dataschema attribute.
	DataSchemaHeader = "cloudevents-dataschema"
)

// IDNamespace is the UUID namespace of the event IDs [EventID] derives: the UUIDv5 of the
// URL "https://github.com/txoutbox/outbox/cloudevents#id" in the RFC 9562 URL namespace.
var IDNamespace = uuid.MustParse("c3decd62-6f5e-5f07-b4af-780532cb8496")

// EventID returns the event ID of a CloudEvent with the given source and id: the id itself
// when it is a UUID in hyphenated form (any case) other than the nil UUID, else the UUIDv5
// (SHA-1) of source + "\x00" + id in [IDNamespace]. Consumers key their inbox by it, so a
// foreign event is handled once however often it is delivered. The source of such an id
// must not contain NUL (CloudEvents forbids control characters): the decoder rejects it.
func EventID(source, id string) uuid.UUID {
	if u, ok := uuidOf(id); ok {
		return u
	}
	return uuid.NewSHA1(IDNamespace, []byte(source+"\x00"+id))
}

// uuidOf parses id when it is a hyphenated, non-nil UUID.
func uuidOf(id string) (uuid.UUID, bool) {
	if len(id) != 36 {
		return uuid.Nil, false
	}
	u, err := uuid.Parse(id)
	return u, err == nil && u != uuid.Nil
}

// IsJSON reports whether contentType is JSON: application/json or a type with the "+json"
// structured syntax suffix, in any case and with any parameters. A transport that must
// change a payload's bytes to carry it can then escape JSON inside JSON strings instead.
func IsJSON(contentType string) bool { return mediatype.IsJSON(contentType) }

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
	specversion, id, typ, source, time, datacontenttype, subject, dataschema, key, txheaders string
	prefix                                                                                   string // of extensions
}

var (
	plainNames  = attrNames{"specversion", "id", "type", "source", "time", "datacontenttype", "subject", "dataschema", extKey, extTxHeaders, ""}
	binaryNames = attrNames{HeaderPrefix + "specversion", HeaderPrefix + "id", HeaderPrefix + "type", HeaderPrefix + "source",
		HeaderPrefix + "time", ContentTypeHeader, HeaderPrefix + "subject", HeaderPrefix + "dataschema", HeaderPrefix + extKey,
		HeaderPrefix + extTxHeaders, HeaderPrefix}
)

// eachAttribute calls f with each context attribute of m (id, type, …, extensions), named
// as n says; every name is distinct. On error, f may have been called for some of them.
func eachAttribute(m outbox.Message, source string, n *attrNames, f func(name, value string)) error {
	source = cmp.Or(m.Headers[SourceHeader], source, DefaultSource)
	id := m.ID.String()
	// A foreign id goes back out only if it still names this event.
	orig := m.Headers[IDHeader]
	keepOrig := orig != "" && EventID(source, orig) == m.ID
	if keepOrig {
		id = orig
	}
	f(n.specversion, SpecVersion)
	f(n.id, id)
	f(n.typ, m.Type)
	f(n.source, source)
	if !m.CreatedAt.IsZero() {
		f(n.time, m.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	f(n.datacontenttype, cmp.Or(m.ContentType, outbox.JSON.ContentType()))
	if m.Key != "" {
		f(n.key, m.Key)
	}
	var other map[string]string
	for k, v := range m.Headers {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("outbox: message %s: header %q is not valid UTF-8 and cannot travel as a CloudEvents attribute", m.ID, k)
		}
		switch {
		case k == IDHeader && keepOrig, k == SourceHeader && v != "":
			continue // written as id and source above
		case k == SubjectHeader && v != "":
			f(n.subject, v)
			continue
		case k == DataSchemaHeader && v != "":
			f(n.dataschema, v)
			continue
		case !reserved[k] && extName.MatchString(k):
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

// problems collects what is wrong with a message, for one readable error.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return errors.New("not a valid CloudEvent: " + strings.Join(p, "; "))
}

// fromAttributes rebuilds a message from unprefixed attributes and a body, adding its
// problems to bad. On error the message holds what could be read.
func fromAttributes(a map[string]string, body []byte, bad problems) (outbox.Message, error) {
	m := outbox.Message{Type: a["type"], Key: a[extKey], ContentType: a["datacontenttype"], Body: body}
	if v, ok := a["specversion"]; !ok {
		bad.add("no specversion")
	} else if v != SpecVersion {
		bad.add("specversion %q, want %q", v, SpecVersion)
	}
	id, source := a["id"], a["source"]
	_, isUUID := uuidOf(id)
	switch {
	case id == "":
		bad.add("no id")
	case !isUUID && strings.IndexByte(source, 0) >= 0:
		// source + NUL + id would not name one (source, id) pair.
		bad.add("source %q contains NUL", source)
	default:
		m.ID = EventID(source, id)
	}
	if m.Type == "" {
		bad.add("no type")
	}
	if t := a["time"]; t != "" {
		// RFC 3339 allows "t" and "z"; Go's parser wants them in upper case.
		created, err := time.Parse(time.RFC3339Nano, strings.ToUpper(t))
		if err != nil {
			bad.add("time %q is not RFC 3339", t)
		}
		m.CreatedAt = created.UTC()
	}
	headers := func() map[string]string {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		return m.Headers
	}
	for k, v := range a {
		if !reserved[k] {
			headers()[k] = v
		}
	}
	if raw := a[extTxHeaders]; raw != "" {
		var other map[string]string
		if err := json.Unmarshal([]byte(raw), &other); err != nil {
			bad.add("extension %s is not a JSON object of strings", extTxHeaders)
		}
		for k, v := range other {
			headers()[k] = v
		}
	}
	// Keep an id that is not the event ID as written: not a UUID, or one in upper case.
	if m.ID != uuid.Nil && (!isUUID || id != strings.ToLower(id)) {
		headers()[IDHeader] = id
		if !isUUID && source != "" {
			headers()[SourceHeader] = source
		}
	}
	if v := a["subject"]; v != "" {
		headers()[SubjectHeader] = v
	}
	if v := a["dataschema"]; v != "" {
		headers()[DataSchemaHeader] = v
	}
	return m, bad.err()
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

// Binary-mode header styles, best first: when two headers name the same attribute, the
// better style wins (then the smaller header name, so the choice never depends on map order).
const (
	styleExact      = iota // "ce-id", "content-type"
	styleOtherCase         // "Ce-Id", "Content-Type"
	styleUnderscore        // "ce_id"
	styleBare              // "traceparent", next to "ce-" attributes
)

// bareExtensions are the extensions read from headers without a prefix.
var bareExtensions = map[string]bool{extKey: true, "traceparent": true, "tracestate": true}

// binaryAttribute returns the attribute a binary-mode header carries, and its style.
func binaryAttribute(header string) (name string, style int, ok bool) {
	const n = len(HeaderPrefix)
	switch {
	case len(header) > n && header[:n] == HeaderPrefix && strings.ToLower(header) == header:
		return header[n:], styleExact, true
	case len(header) > n && strings.EqualFold(header[:n], HeaderPrefix):
		return strings.ToLower(header[n:]), styleOtherCase, true
	case len(header) > n && strings.EqualFold(header[:n], "ce_"):
		return strings.ToLower(header[n:]), styleUnderscore, true
	case header == ContentTypeHeader:
		return "datacontenttype", styleExact, true
	case strings.EqualFold(header, ContentTypeHeader):
		return "datacontenttype", styleOtherCase, true
	case bareExtensions[strings.ToLower(header)]:
		return strings.ToLower(header), styleBare, true
	}
	return "", 0, false
}

// binaryAttributes picks the CloudEvents attributes out of binary-mode headers.
func binaryAttributes(headers map[string]string) map[string]string {
	type pick struct {
		name   string
		style  int
		header string
	}
	a := make(map[string]string, len(headers))
	var others []pick // only foreign messages have any
	for k, v := range headers {
		name, style, ok := binaryAttribute(k)
		switch {
		case !ok:
		case style == styleExact: // one header per name: no clash among these
			a[name] = v
		default:
			others = append(others, pick{name, style, k})
		}
	}
	slices.SortFunc(others, func(x, y pick) int {
		return cmp.Or(cmp.Compare(x.style, y.style), strings.Compare(x.header, y.header))
	})
	for _, p := range others {
		if _, taken := a[p.name]; !taken {
			a[p.name] = headers[p.header]
		}
	}
	return a
}

// contentMode tells a structured-mode or batch-mode content type from a payload's.
func contentMode(ct string) (structured, batch bool) {
	const prefix = "application/cloudevents"
	if len(ct) < len(prefix) || !strings.EqualFold(ct[:len(prefix)], prefix) {
		return false, false // the common case, without parsing
	}
	mt := mediatype.Base(ct)
	return mt == StructuredContentType, mt == "application/cloudevents-batch+json"
}

// FromBinary rebuilds a message from binary-mode headers and body, in any of the header
// styles the package comment lists; headers that carry no attribute are ignored. A message
// in structured mode (content-type application/cloudevents+json, or no CloudEvents headers
// and a JSON object as the body) is read with [FromStructured]. Its error, for a message
// that is not a valid event, is an [*outbox.MalformedError] holding what could be read,
// headers and body.
func FromBinary(headers map[string]string, body []byte) (outbox.Message, error) {
	a := binaryAttributes(headers)
	var m outbox.Message
	var err error
	structured, batch := contentMode(a["datacontenttype"])
	switch {
	case batch:
		err = errors.New("a batch of CloudEvents (batch mode) is not supported: send one event per message")
	case structured || a["specversion"] == "" && startsObject(body):
		if m, err = fromStructured(body); err == nil {
			// Tracing instrumentation writes trace context into the transport's headers.
			if v := a[extKey]; v != "" && m.Key == "" {
				m.Key = v
			}
			for _, name := range []string{"traceparent", "tracestate"} {
				if v := a[name]; v != "" && m.Headers[name] == "" {
					if m.Headers == nil {
						m.Headers = map[string]string{}
					}
					m.Headers[name] = v
				}
			}
		}
	default:
		m, err = fromAttributes(a, body, nil)
	}
	if err != nil {
		return outbox.Message{}, &outbox.MalformedError{Partial: m, Attributes: cloneMap(headers), Body: body, Err: err}
	}
	return m, nil
}

func startsObject(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// ToStructured returns m as one structured-mode JSON document. A JSON payload is embedded
// as "data" byte for byte (no re-encoding, no HTML escaping; surrounding white space aside);
// any other payload is base64 in "data_base64".
func ToStructured(m outbox.Message, source string) ([]byte, error) {
	a, err := attributes(m, source)
	if err != nil {
		return nil, err
	}
	embed := IsJSON(a["datacontenttype"]) && json.Valid(m.Body)
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

// FromStructured decodes a structured-mode JSON document. Its error, for a document that is
// not a valid event, is an [*outbox.MalformedError] holding what could be read and the
// document as its Body.
func FromStructured(doc []byte) (outbox.Message, error) {
	m, err := fromStructured(doc)
	if err != nil {
		return outbox.Message{}, &outbox.MalformedError{Partial: m, Body: doc, Err: err}
	}
	return m, nil
}

// fromStructured decodes a structured-mode document; on error the message holds what could
// be read.
func fromStructured(doc []byte) (outbox.Message, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(doc, &raw); err != nil {
		return outbox.Message{Body: doc}, fmt.Errorf("not a JSON CloudEvent: %w", err)
	}
	a := make(map[string]string, len(raw))
	for k, v := range raw {
		if k == "data" || k == "data_base64" {
			continue
		}
		if s, ok := attributeText(v); ok {
			a[k] = s
		}
	}
	var bad problems
	body, err := structuredData(raw, a["datacontenttype"])
	if err != nil {
		bad.add("%v", err)
		body = doc
	}
	return fromAttributes(a, body, bad)
}

// attributeText returns a structured-mode attribute value as text: a string as it is, a
// number or boolean as its JSON text (extensions may be any CloudEvents type), an object or
// array as compact JSON. It reports false for null, which means the attribute is absent.
func attributeText(v json.RawMessage) (string, bool) {
	switch v[0] {
	case '"':
		var s string
		_ = json.Unmarshal(v, &s) // a string json.Unmarshal already read as valid
		return s, true
	case 'n':
		return "", false
	case '{', '[':
		var buf bytes.Buffer
		_ = json.Compact(&buf, v)
		return buf.String(), true
	}
	return string(v), true
}

// structuredData returns the payload of a structured-mode event.
func structuredData(raw map[string]json.RawMessage, contentType string) ([]byte, error) {
	data, hasData := raw["data"]
	b64, hasB64 := raw["data_base64"]
	if hasB64 && string(b64) == "null" {
		hasB64 = false
	}
	switch {
	case hasData && hasB64:
		return nil, errors.New("both data and data_base64 are set")
	case hasB64:
		var s string
		if err := json.Unmarshal(b64, &s); err != nil {
			return nil, errors.New("data_base64 is not a string")
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			if b, err = base64.RawStdEncoding.DecodeString(s); err != nil {
				return nil, fmt.Errorf("data_base64 is not base64: %w", err)
			}
		}
		return b, nil
	case hasData && contentType != "" && !IsJSON(contentType) && data[0] == '"':
		// Not JSON: the payload travels as a JSON string (text/plain "hello" → "hello").
		var s string
		_ = json.Unmarshal(data, &s)
		return []byte(s), nil
	case hasData:
		return []byte(data), nil
	}
	return nil, nil
}

// Malformed returns the error a transport's [outbox.Delivery.Message] reports for a broker
// message that is not a valid event: err, normally the error of [FromBinary] or
// [FromStructured] (whose Partial message it keeps), completed with the message as the
// broker delivered it: its own message ID, every header or attribute and the body, before
// any decoding. A transport decodes and reports like this:
//
//	m, err := cloudevents.FromBinary(headers, body)
//	if err != nil {
//		return outbox.Message{}, cloudevents.Malformed(err, brokerID, headers, body)
//	}
func Malformed(err error, brokerMessageID string, attributes map[string]string, body []byte) *outbox.MalformedError {
	me := &outbox.MalformedError{BrokerMessageID: brokerMessageID, Attributes: attributes, Body: body, Err: err}
	var dec *outbox.MalformedError
	if errors.As(err, &dec) {
		me.Partial, me.Err = dec.Partial, dec.Err
	}
	return me
}
