package deadletter

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Raw is a dead letter as it came, before anything was changed to store it: the original
// of every text field, the broker's attributes and body of a malformed message, the columns
// of an outbox row the relay could not read. Fields that were not known are empty.
//
// The table's raw column holds it in the text format of [Raw.MarshalText], which a person
// can read with plain SQL (encode(raw, 'escape') on PostgreSQL, CAST(raw AS CHAR) on MySQL,
// CAST(raw AS TEXT) on SQLite):
//
//	txoutbox-raw/1
//	type: "orders.placed\x00"
//	key: "order-42"
//	header "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
//	reason: "no handler for event type \"orders.placed\\x00\""
//	attribute "ce-type": "orders.placed\x00"
//
//	{"order":42}
//
// The first line names the format. Each following line is a field: a name, or "header",
// "attribute" and a quoted name, then ": " and the value, quoted as Go quotes strings
// ([strconv.Quote]: printable text as is, anything else escaped, so every byte survives).
// An empty line ends the fields; the bytes after it, to the end, are Body. Without a body
// the empty line is left out.
type Raw struct {
	// ID is the event ID as it was read (text that is not a UUID, for an outbox row).
	ID          string
	Type        string
	Key         string
	ContentType string
	// CreatedAt is the creation time as it was read (an outbox row's unreadable text, or a
	// time outside what the table can hold, in RFC 3339).
	CreatedAt string
	// Headers are the event's headers before they were made storable.
	Headers map[string]string
	// HeadersText is an outbox row's headers column when it was not a JSON object of
	// strings (Headers is nil then).
	HeadersText     string
	Consumer        string
	Reason          string
	BrokerMessageID string
	// Attributes are a malformed message's headers or attributes exactly as the broker
	// delivered them.
	Attributes map[string]string
	// Body is the body as received when it differs from the entry's Message.Body (a
	// malformed message whose body was not decoded); nil when they are the same.
	Body []byte
}

const rawMagic = "txoutbox-raw/1"

// rawFields are Raw's single-value fields, in the order they are written.
func (r *Raw) rawFields() []struct {
	name string
	v    *string
} {
	return []struct {
		name string
		v    *string
	}{
		{"id", &r.ID}, {"type", &r.Type}, {"key", &r.Key}, {"content-type", &r.ContentType},
		{"created-at", &r.CreatedAt}, {"headers", &r.HeadersText}, {"consumer", &r.Consumer},
		{"reason", &r.Reason}, {"broker-message-id", &r.BrokerMessageID},
	}
}

// MarshalText encodes r in the format described on [Raw]. It never fails.
func (r *Raw) MarshalText() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(rawMagic + "\n")
	line := func(name, value string) {
		b.WriteString(name)
		b.WriteString(": ")
		b.WriteString(strconv.Quote(value))
		b.WriteByte('\n')
	}
	for _, f := range r.rawFields() {
		if *f.v != "" {
			line(f.name, *f.v)
		}
	}
	for _, group := range []struct {
		name string
		m    map[string]string
	}{{"header", r.Headers}, {"attribute", r.Attributes}} {
		for _, k := range slices.Sorted(maps.Keys(group.m)) {
			line(group.name+" "+strconv.Quote(k), group.m[k])
		}
	}
	if r.Body != nil {
		b.WriteByte('\n')
		b.Write(r.Body)
	}
	return b.Bytes(), nil
}

// UnmarshalText decodes the format described on [Raw] into r.
func (r *Raw) UnmarshalText(text []byte) error {
	*r = Raw{}
	rest := text
	next := func() (string, bool) {
		if len(rest) == 0 {
			return "", false
		}
		line, after, found := bytes.Cut(rest, []byte{'\n'})
		if !found {
			after = nil
		}
		rest = after
		return string(line), true
	}
	if first, _ := next(); first != rawMagic {
		return fmt.Errorf("deadletter: raw value does not start with %q", rawMagic)
	}
	single := map[string]*string{}
	for _, f := range r.rawFields() {
		single[f.name] = f.v
	}
	for n := 2; ; n++ {
		line, ok := next()
		if !ok {
			return nil
		}
		if line == "" {
			r.Body = append([]byte{}, rest...)
			return nil
		}
		if err := r.parseLine(line, single); err != nil {
			return fmt.Errorf("deadletter: raw value, line %d: %w", n, err)
		}
	}
}

func (r *Raw) parseLine(line string, single map[string]*string) error {
	name, rest, _ := strings.Cut(line, " ")
	var group *map[string]string
	switch name {
	case "header", "attribute":
		group = &r.Headers
		if name == "attribute" {
			group = &r.Attributes
		}
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return fmt.Errorf("%s name: %w", name, err)
		}
		if name, err = strconv.Unquote(q); err != nil {
			return err
		}
		rest = rest[len(q):]
		if !strings.HasPrefix(rest, ": ") {
			return fmt.Errorf("no ': ' after the %s name", name)
		}
		rest = rest[2:]
	default:
		field, ok := strings.CutSuffix(name, ":")
		if !ok || single[field] == nil {
			return fmt.Errorf("unknown field %q", name)
		}
		name = field
	}
	value, err := strconv.Unquote(rest)
	if err != nil {
		return fmt.Errorf("value of %s: %w", name, err)
	}
	if group == nil {
		*single[name] = value
		return nil
	}
	if *group == nil {
		*group = map[string]string{}
	}
	(*group)[name] = value
	return nil
}
