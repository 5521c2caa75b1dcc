package outboxnats

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/outbox"
)

// SetOnAck makes s call f with every publish ack the stream returns, so tests can see
// acks flagged Duplicate.
func SetOnAck(s *Sender, f func(outbox.Message, *jetstream.PubAck)) { s.onAck = f }

// EncodedSize returns the size of m on the wire, headers and body, as the server counts it.
func EncodedSize(s *Sender, m outbox.Message) (int, error) {
	nm, err := s.encode(m, 0, "", nil)
	if err != nil {
		return 0, err
	}
	return headerSize(nm.Header) + len(nm.Data), nil
}

// Encode returns m as s would publish it.
func Encode(s *Sender, m outbox.Message) (*nats.Msg, error) { return s.encode(m, 0, "", nil) }

// headerSize is the size of h on the wire, as the server counts it against max_payload:
// "NATS/1.0\r\n", a "key: value\r\n" line per value, and a closing "\r\n".
func headerSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += headerLine(k, v)
		}
	}
	return n
}
