package mediatype

import "testing"

func TestBase(t *testing.T) {
	for ct, want := range map[string]string{
		"application/json":                     "application/json",
		"Application/JSON; charset=UTF-8":      "application/json",
		"application/json;charset=utf-8":       "application/json",
		"application/json; charset":            "application/json", // bad parameter, readable type
		"application/vnd.shop.order+json; v=2": "application/vnd.shop.order+json",
		"":                                     "",
		"not a media type":                     "",
	} {
		if got := Base(ct); got != want {
			t.Errorf("Base(%q) = %q, want %q", ct, got, want)
		}
	}
}

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                     true,
		"application/json; charset=utf-8":      true,
		"APPLICATION/JSON":                     true,
		"application/cloudevents+json":         true,
		"application/vnd.shop.order+JSON; v=2": true,
		"text/plain":                           false,
		"application/jsonl":                    false,
		"application/json-patch":               false,
		"application/octet-stream":             false,
		"":                                     false,
	} {
		if got := IsJSON(ct); got != want {
			t.Errorf("IsJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}
