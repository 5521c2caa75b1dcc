package outboxrabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
)

// Where returns url's host:port/vhost, without credentials.
func Where(url string) string { return newLink(Connection{URL: url}).where }

// Reconnects returns how many times s redialled after its first connection.
func (s *Sender) Reconnects() int { return s.link.reconnects() }

// Reconnects returns how many times r redialled after its first connection.
func (r *Receiver) Reconnects() int { return r.link.reconnects() }

// Encode returns m as s would publish it.
func Encode(s *Sender, m outbox.Message) (amqp.Publishing, error) { return encode(m, s.cfg.Source) }
