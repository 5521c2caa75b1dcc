package outboxnats

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestParseAck: what each kind of ack means, including acks as nats-server writes them.
func TestParseAck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, data string
		full       bool
		wantErr    error
		wantAck    *jetstream.PubAck
	}{
		{name: "stored", data: `{"stream":"ORDERS","seq":42}`},
		{name: "stored, as nats-server writes it", data: `{"stream":"ORDERS", "seq":42}`},
		{name: "duplicate, as nats-server writes it", data: `{"stream":"ORDERS", "seq":1,"duplicate": true}`},
		{name: "stored, full", data: `{"stream":"ORDERS","seq":42}`, full: true, wantAck: &jetstream.PubAck{Stream: "ORDERS", Sequence: 42}},
		{name: "duplicate, full", data: `{"stream":"ORDERS","seq":7,"duplicate":true}`, full: true, wantAck: &jetstream.PubAck{Stream: "ORDERS", Sequence: 7, Duplicate: true}},
		{name: "api error", data: `{"error":{"code":400,"err_code":10054,"description":"maximum message size exceeded"}}`,
			wantErr: &jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "maximum message size exceeded"}},
		{name: "stream and error", data: `{"stream":"ORDERS","error":{"code":503,"err_code":10077}}`,
			wantErr: &jetstream.APIError{Code: 503, ErrorCode: 10077}},
		{name: "no stream", data: `{"seq":1}`, wantErr: jetstream.ErrInvalidJSAck},
		{name: "not json", data: `{"stream":"ORDERS"`, wantErr: jetstream.ErrInvalidJSAck},
		{name: "cut short", data: `{"stream":"ORDERS","seq":4`, wantErr: jetstream.ErrInvalidJSAck},
	} {
		t.Run(c.name, func(t *testing.T) {
			ack, err := parseAck([]byte(c.data), c.full)
			var api, wantAPI *jetstream.APIError
			switch {
			case errors.As(c.wantErr, &wantAPI):
				if !errors.As(err, &api) || *api != *wantAPI {
					t.Fatalf("parseAck = %v, want %v", err, c.wantErr)
				}
			case c.wantErr != nil:
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("parseAck = %v, want %v", err, c.wantErr)
				}
			case err != nil:
				t.Fatalf("parseAck = %v, want success", err)
			}
			if (ack == nil) != (c.wantAck == nil) || ack != nil && *ack != *c.wantAck {
				t.Fatalf("ack = %+v, want %+v", ack, c.wantAck)
			}
		})
	}
}

// TestParseStoredAckDecodesNothing: a plain "stored" ack, as nats-server writes it, is
// recognised without decoding: nothing allocated. (Not parallel: AllocsPerRun forbids it.)
func TestParseStoredAckDecodesNothing(t *testing.T) {
	for _, data := range []string{`{"stream":"ORDERS", "seq":42}`, `{"stream":"ORDERS", "seq":1,"duplicate": true}`, `{"stream":"ORDERS","seq":42}`} {
		ack := []byte(data)
		if n := testing.AllocsPerRun(10, func() { _, _ = parseAck(ack, false) }); n != 0 {
			t.Errorf("ack %s cost %v allocations, want 0 (decoded instead of recognised)", data, n)
		}
	}
}
