// Package mediatype compares Content-Type values as RFC 2045 defines them: type and subtype
// in any case, parameters ignored. The codec registry and the CloudEvents wire format share it.
package mediatype

import (
	"mime"
	"strings"
)

// Base returns ct's media type in lower case, without parameters: "application/json" for
// "Application/JSON; charset=utf-8". It returns "" when ct is not a media type.
func Base(ct string) string {
	// A parameter that does not parse still leaves the media type readable.
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil && err != mime.ErrInvalidMediaParameter {
		return ""
	}
	return mt
}

// IsJSON reports whether ct is JSON: application/json or a type with the +json structured
// syntax suffix (RFC 6839), such as application/cloudevents+json, with any parameters.
func IsJSON(ct string) bool {
	if ct == "application/json" { // our own messages: no parsing
		return true
	}
	mt := Base(ct)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
