package outboxsqs

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/cloudevents"
)

const (
	// maxAttributes is SQS's limit of message attributes per message.
	maxAttributes = 10
	// bodyAttr marks a body that is not the payload as is: "base64" or "empty".
	bodyAttr   = "txoutbox-body"
	bodyBase64 = "base64"
	bodyEmpty  = "empty"
	emptyBody  = "-" // SQS needs a body of at least one character
	// txHeadersAttr is the wire format's extension for headers that are not attributes;
	// headers that do not fit in SQS's attributes are folded into it.
	txHeadersAttr = cloudevents.HeaderPrefix + "txheaders"
	stringType    = "String"
)

// coreAttrs are the binary-mode attributes that always stay attributes.
var coreAttrs = map[string]bool{
	cloudevents.HeaderPrefix + "specversion":  true,
	cloudevents.HeaderPrefix + "id":           true,
	cloudevents.HeaderPrefix + "type":         true,
	cloudevents.HeaderPrefix + "source":       true,
	cloudevents.HeaderPrefix + "time":         true,
	cloudevents.HeaderPrefix + "partitionkey": true,
	cloudevents.ContentTypeHeader:             true,
	txHeadersAttr:                          true,
}

// foldedAs names the message header an attribute becomes when it is folded into
// txheaders: an extension its own name, the attributes kept in headers their header.
var foldedAs = map[string]string{
	cloudevents.HeaderPrefix + "subject":    cloudevents.SubjectHeader,
	cloudevents.HeaderPrefix + "dataschema": cloudevents.DataSchemaHeader,
}

// firstExtensions keep their own attribute before any other header: W3C trace context,
// which CloudEvents' distributed-tracing extension and other SDKs read, then the optional
// attributes of the spec.
var firstExtensions = []string{cloudevents.HeaderPrefix + "traceparent", cloudevents.HeaderPrefix + "tracestate",
	cloudevents.HeaderPrefix + "subject", cloudevents.HeaderPrefix + "dataschema"}

// wireMessage is one message as SQS will see it.
type wireMessage struct {
	body  string
	attrs map[string]types.MessageAttributeValue
	size  int // as SQS counts it: body + attribute names, data types and values
}

// encode turns m into an SQS body and at most 10 String attributes (CloudEvents binary
// mode). Its errors are about m itself and cannot be fixed by retrying.
func encode(m outbox.Message, source string) (wireMessage, error) {
	if m.ID == uuid.Nil {
		// On a FIFO queue the zero ID would dedup every such message into one.
		return wireMessage{}, fmt.Errorf("message of type %q has no ID", m.Type)
	}
	if m.Type == "" {
		return wireMessage{}, fmt.Errorf("message %s has no event type", m.ID)
	}
	for k, v := range m.Headers {
		// JSON, which carries the headers that are not attributes, would replace the bytes.
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return wireMessage{}, fmt.Errorf("message %s: header %q is not valid UTF-8", m.ID, k)
		}
	}
	h, err := cloudevents.ToBinary(m, source)
	if err != nil {
		return wireMessage{}, fmt.Errorf("encoding message %s as a CloudEvent: %w", m.ID, err)
	}
	var w wireMessage
	switch {
	case len(m.Body) == 0:
		w.body, h[bodyAttr] = emptyBody, bodyEmpty
	case validText(string(m.Body)):
		w.body = string(m.Body)
	case cloudevents.IsJSON(h[cloudevents.ContentTypeHeader]) && utf8.Valid(m.Body) && json.Valid(m.Body):
		// Characters SQS refuses (U+FFFE, U+FFFF) can only sit inside JSON strings, where
		// an escape means the same: the body stays JSON that any reader parses.
		w.body = escapeJSON(m.Body)
	default:
		w.body, h[bodyAttr] = base64.StdEncoding.EncodeToString(m.Body), bodyBase64
	}
	if err := foldHeaders(h, maxAttributes); err != nil {
		return wireMessage{}, fmt.Errorf("message %s: %w", m.ID, err)
	}
	w.size = len(w.body)
	w.attrs = make(map[string]types.MessageAttributeValue, len(h))
	for name, v := range h {
		if !validText(v) || v == "" {
			return wireMessage{}, fmt.Errorf("message %s: attribute %s %q is empty or has characters SQS does not accept", m.ID, name, v)
		}
		w.attrs[name] = types.MessageAttributeValue{DataType: ptr(stringType), StringValue: ptr(v)}
		w.size += len(name) + len(stringType) + len(v)
	}
	return w, nil
}

// foldHeaders moves header extensions into the "ce-txheaders" JSON extension until h has
// at most slots attributes, and moves there any extension SQS would reject as an attribute
// (empty, or with characters outside XML 1.0). FromBinary reads them back as headers.
func foldHeaders(h map[string]string, slots int) error {
	var exts []string
	for name := range h {
		if !coreAttrs[name] && name != bodyAttr {
			exts = append(exts, name)
		}
	}
	slices.SortFunc(exts, func(a, b string) int {
		ia, ib := slices.Index(firstExtensions, a), slices.Index(firstExtensions, b)
		switch {
		case ia >= 0 && ib >= 0:
			return ia - ib
		case ia >= 0:
			return -1
		case ib >= 0:
			return 1
		}
		return strings.Compare(a, b)
	})
	var fold []string
	for _, name := range exts {
		if v := h[name]; v == "" || !validText(v) {
			fold = append(fold, name)
		}
	}
	keep := slices.DeleteFunc(slices.Clone(exts), func(n string) bool { return slices.Contains(fold, n) })
	fixed := len(h) - len(exts) // core attributes, txheaders if there, the body marker
	_, hasTx := h[txHeadersAttr]
	if fixed+len(keep)+b2i(!hasTx && len(fold) > 0) > slots {
		room := max(slots-fixed-b2i(!hasTx), 0) // folding adds txheaders if it is not there
		fold = append(fold, keep[min(room, len(keep)):]...)
	}
	if len(fold) == 0 {
		return nil
	}
	other := map[string]string{}
	if raw, ok := h[txHeadersAttr]; ok {
		if err := json.Unmarshal([]byte(raw), &other); err != nil {
			return fmt.Errorf("reading back the %s extension: %w", txHeadersAttr, err)
		}
	}
	for _, name := range fold {
		header, ok := foldedAs[name]
		if !ok {
			header = strings.TrimPrefix(name, cloudevents.HeaderPrefix)
		}
		other[header] = h[name]
		delete(h, name)
	}
	b, err := json.Marshal(other)
	if err != nil {
		return fmt.Errorf("folding headers into %s: %w", txHeadersAttr, err)
	}
	h[txHeadersAttr] = string(b)
	if len(h) > slots {
		return fmt.Errorf("%d attributes do not fit in the %d SQS allows", len(h), slots)
	}
	return nil
}

// decode rebuilds a message from what ReceiveMessage returned. Its error is an
// *outbox.MalformedError holding the message as SQS delivered it: its MessageId, every
// attribute (String and Number values as text, Binary values as their bytes) and the body.
func decode(msg types.Message) (outbox.Message, error) {
	h := make(map[string]string, len(msg.MessageAttributes))
	for name, v := range msg.MessageAttributes {
		// Numbers too: another producer may send an integer extension as one.
		if dt := deref(v.DataType); v.StringValue != nil && (strings.HasPrefix(dt, stringType) || strings.HasPrefix(dt, "Number")) {
			h[name] = *v.StringValue
		}
	}
	rawBody := []byte(deref(msg.Body))
	body, bodyErr := rawBody, error(nil)
	switch enc := h[bodyAttr]; enc {
	case "":
	case bodyEmpty:
		body = nil
	case bodyBase64:
		if body, bodyErr = base64.StdEncoding.DecodeString(string(rawBody)); bodyErr != nil {
			bodyErr = fmt.Errorf("attribute %s is %q but the body is not base64: %w", bodyAttr, enc, bodyErr)
		}
	default:
		bodyErr = fmt.Errorf("attribute %s has the unknown value %q", bodyAttr, enc)
	}
	if bodyErr != nil {
		// Keep what the attributes say, with the body as it came.
		partial, err := cloudevents.FromBinary(h, rawBody)
		if err != nil {
			partial = cloudevents.Malformed(err, "", nil, nil).Partial
		}
		me := cloudevents.Malformed(bodyErr, deref(msg.MessageId), rawAttributes(msg), rawBody)
		me.Partial = partial
		return outbox.Message{}, me
	}
	m, err := cloudevents.FromBinary(h, body)
	if err != nil {
		return outbox.Message{}, cloudevents.Malformed(err, deref(msg.MessageId), rawAttributes(msg), rawBody)
	}
	return m, nil
}

// rawAttributes returns every message attribute of msg as it arrived: String and Number
// values as text, Binary values as their bytes.
func rawAttributes(msg types.Message) map[string]string {
	raw := make(map[string]string, len(msg.MessageAttributes))
	for name, v := range msg.MessageAttributes {
		switch {
		case v.StringValue != nil:
			raw[name] = *v.StringValue
		case v.BinaryValue != nil:
			raw[name] = string(v.BinaryValue)
		}
	}
	return raw
}

// escapeJSON returns a valid UTF-8 JSON text with the characters SQS does not accept
// written as \u escapes. Outside strings JSON has only white space SQS accepts, so every
// such character is inside a string, where the escape means the same character.
func escapeJSON(b []byte) string {
	var out strings.Builder
	out.Grow(len(b) + 16)
	for _, r := range string(b) {
		if validRune(r) {
			out.WriteRune(r)
			continue
		}
		fmt.Fprintf(&out, `\u%04x`, r)
	}
	return out.String()
}

// validText reports whether SQS accepts s in a body or attribute: UTF-8 of the XML 1.0
// characters #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF.
func validText(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf { // ASCII fast path
			if c < 0x20 && c != '\t' && c != '\n' && c != '\r' {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !validRune(r) {
			return false
		}
		i += n
	}
	return true
}

// validRune reports whether r is an XML 1.0 character, which SQS accepts.
func validRune(r rune) bool {
	switch {
	case r < 0x20:
		return r == '\t' || r == '\n' || r == '\r'
	case r >= 0xD800 && r < 0xE000, r == 0xFFFE, r == 0xFFFF, r > utf8.MaxRune:
		return false
	}
	return true
}

// validGroupID reports whether s is a valid MessageGroupId: 1-128 of a-z A-Z 0-9 and
// ASCII punctuation.
func validGroupID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// groupID is a FIFO message's MessageGroupId: the event key when SQS accepts it as one,
// else a hash of it (keys that share a hash only share an order, which is harmless).
func groupID(key string) string {
	if validGroupID(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256-" + hex.EncodeToString(sum[:])
}

// formatSize writes n bytes in KiB ("256 KiB", "300.5 KiB") for error messages.
func formatSize(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/1024)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func ptr[T any](v T) *T { return &v }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
