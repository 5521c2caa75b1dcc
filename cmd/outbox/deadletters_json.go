package main

import (
	"encoding/base64"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// entryJSON is a dead letter as --json prints it.
type entryJSON struct {
	ID              int64      `json:"id"`
	Status          string     `json:"status"`
	StatusChangedAt *time.Time `json:"status_changed_at,omitempty"`
	Stage           string     `json:"stage"`
	Kind            string     `json:"kind"`
	Consumer        string     `json:"consumer,omitempty"`
	Reason          string     `json:"reason"`
	Attempts        int        `json:"attempts"`
	FirstFailedAt   time.Time  `json:"first_failed_at"`
	LastFailedAt    time.Time  `json:"last_failed_at"`
	BrokerMessageID string     `json:"broker_message_id,omitempty"`
	Event           eventJSON  `json:"event"`
	Raw             *rawJSON   `json:"raw,omitempty"`
	// RawBytes is the raw evidence's size, in a list (which leaves it out).
	RawBytes int64 `json:"raw_bytes,omitempty"`
}

type eventJSON struct {
	ID          string            `json:"id,omitempty"`
	Type        string            `json:"type"`
	Key         string            `json:"key,omitempty"`
	ContentType string            `json:"content_type"`
	CreatedAt   time.Time         `json:"created_at"`
	Headers     map[string]string `json:"headers,omitempty"`
	BodyBytes   int64             `json:"body_bytes"`
	body
}

// body is a payload in JSON: as JSON when it is, as text when it is UTF-8, else base64.
type body struct {
	JSON   json.RawMessage `json:"body_json,omitempty"`
	Text   *string         `json:"body_text,omitempty"`
	Base64 string          `json:"body_base64,omitempty"`
}

func toBody(b []byte) body {
	switch {
	case len(b) > 0 && json.Valid(b):
		return body{JSON: json.RawMessage(b)}
	case utf8.Valid(b):
		s := string(b)
		return body{Text: &s}
	}
	return body{Base64: base64.StdEncoding.EncodeToString(b)}
}

type rawJSON struct {
	ID              string            `json:"id,omitempty"`
	Type            string            `json:"type,omitempty"`
	Key             string            `json:"key,omitempty"`
	ContentType     string            `json:"content_type,omitempty"`
	CreatedAt       string            `json:"created_at,omitempty"`
	Headers         map[string]string `json:"headers,omitempty"`
	HeadersText     string            `json:"headers_text,omitempty"`
	Consumer        string            `json:"consumer,omitempty"`
	Reason          string            `json:"reason,omitempty"`
	BrokerMessageID string            `json:"broker_message_id,omitempty"`
	Attributes      map[string]string `json:"attributes,omitempty"`
	body
}

func toJSON(e deadletter.Entry) entryJSON {
	m := e.Message
	out := entryJSON{
		ID: e.ID, Status: string(e.Status), Stage: string(e.Stage), Kind: string(e.Kind), Consumer: e.Consumer,
		Reason: e.Reason, Attempts: e.Attempts, FirstFailedAt: e.FirstFailedAt, LastFailedAt: e.LastFailedAt,
		BrokerMessageID: e.BrokerMessageID,
		Event: eventJSON{Type: m.Type, Key: m.Key, ContentType: m.ContentType, CreatedAt: m.CreatedAt,
			Headers: m.Headers, BodyBytes: int64(len(m.Body)), body: toBody(m.Body)},
	}
	if !e.StatusChangedAt.IsZero() {
		t := e.StatusChangedAt
		out.StatusChangedAt = &t
	}
	if m.ID != uuid.Nil {
		out.Event.ID = m.ID.String()
	}
	if r := e.Raw; r != nil {
		out.Raw = &rawJSON{ID: r.ID, Type: r.Type, Key: r.Key, ContentType: r.ContentType, CreatedAt: r.CreatedAt,
			Headers: r.Headers, HeadersText: r.HeadersText, Consumer: r.Consumer, Reason: r.Reason,
			BrokerMessageID: r.BrokerMessageID, Attributes: r.Attributes}
		if r.Body != nil {
			out.Raw.body = toBody(r.Body)
		}
	}
	return out
}

// summaryJSON is a listed entry as --json prints it: without its body, headers and raw
// evidence (dead-letters show --json has them), with their sizes.
func summaryJSON(e sqlstore.DeadLetterSummary) entryJSON {
	out := toJSON(e.Entry)
	out.Event.body, out.Event.BodyBytes, out.RawBytes = body{}, e.BodyBytes, e.RawBytes
	return out
}
