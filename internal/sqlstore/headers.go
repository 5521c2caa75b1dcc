package sqlstore

import (
	"encoding/json"
	"slices"
	"strings"
)

// The headers column holds a message's headers as a JSON object of strings. Every event
// written with a trace carries one (its traceparent), so the relay reads one per row it
// claims and the producer writes one per event: encoding/json took 1.7 µs and 10
// allocations to read a one-header object and 0.5 µs to write it, most of what tracing
// cost the relay per event. The form this package writes, and PostgreSQL's jsonb gives
// back, is read and written here directly; anything else (escapes, non-ASCII, values that
// are not strings, broken JSON) goes through encoding/json, which decides and words the
// error, so the results are the same either way (FuzzDecodeHeaders).

// HeadersJSON encodes headers for storage; nil for none. Its output is json.Marshal's
// (keys sorted).
func HeadersJSON(h map[string]string) any {
	if len(h) == 0 {
		return nil
	}
	if s, ok := plainHeadersJSON(h); ok {
		return s
	}
	b, _ := json.Marshal(h) // a map[string]string always encodes
	return string(b)
}

// plainHeadersJSON writes h as json.Marshal does when no key or value needs escaping; ok
// is false otherwise.
func plainHeadersJSON(h map[string]string) (string, bool) {
	var room [8]string // the keys, on the stack for a few
	keys, size := room[:0], 2
	for k, v := range h {
		if !plainJSON(k) || !plainJSON(v) {
			return "", false
		}
		keys = append(keys, k)
		size += len(k) + len(v) + 6
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(size)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(k)
		b.WriteString(`":"`)
		b.WriteString(h[k])
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), true
}

// plainJSON reports whether json.Marshal writes s between quotes as it is: plain bytes
// (plainByte) but the quote and the characters it escapes for HTML (<, >, &).
func plainJSON(s string) bool {
	for i := range len(s) {
		if c := s[i]; !plainByte(c) || c == '"' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// plainByte reports whether c stands for itself in a JSON string, read or written:
// printable ASCII but the backslash.
func plainByte(c byte) bool { return c >= 0x20 && c < 0x7f && c != '\\' }

// decodeHeaders parses the headers column. Like json.Unmarshal into a map, "null" gives a
// nil map and "{}" an empty one.
func decodeHeaders(s string) (map[string]string, error) {
	if m, ok := plainHeaders(s); ok {
		return m, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	return m, nil
}

// plainHeaders reads a JSON object whose keys and values are strings without escapes or
// non-ASCII bytes; ok is false for anything else. Keys and values are substrings of s.
func plainHeaders(s string) (m map[string]string, ok bool) {
	i := skipJSONSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return nil, false
	}
	m = map[string]string{}
	if i = skipJSONSpace(s, i+1); i < len(s) && s[i] == '}' {
		return m, skipJSONSpace(s, i+1) == len(s)
	}
	for {
		k, j, ok := plainString(s, i)
		if !ok {
			return nil, false
		}
		if i = skipJSONSpace(s, j); i == len(s) || s[i] != ':' {
			return nil, false
		}
		v, j, ok := plainString(s, skipJSONSpace(s, i+1))
		if !ok {
			return nil, false
		}
		m[k] = v
		switch i = skipJSONSpace(s, j); {
		case i < len(s) && s[i] == ',':
			i = skipJSONSpace(s, i+1)
		case i < len(s) && s[i] == '}':
			return m, skipJSONSpace(s, i+1) == len(s)
		default:
			return nil, false
		}
	}
}

// plainString reads the string that starts at s[i]; it returns it and the index past its
// closing quote, ok false unless it is quoted printable ASCII without a backslash.
func plainString(s string, i int) (v string, next int, ok bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			return s[i+1 : j], j + 1, true
		case !plainByte(c):
			return "", 0, false
		}
	}
	return "", 0, false
}

// skipJSONSpace returns the index of the first byte from i on that is not JSON whitespace.
func skipJSONSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
