package outboxrabbitmq

import (
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultRetryDelays are the retry queues' delays when [Topology] and [ReceiverConfig] name
// none. A Nack's delay is rounded up to the next of them (above the last, the last): with
// the consumer's default backoff (1s doubling to 5m, with jitter) a retry comes at most a
// few times later than asked, never sooner.
var DefaultRetryDelays = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour}

// Topology is what one consumer's queue needs on the broker, for [Declare]. Production
// setups often declare it in their infrastructure code instead: these are the settings
// txoutbox relies on.
//
//   - Exchange: a durable topic exchange the [Sender] publishes to.
//   - Queue: a durable quorum queue bound to it (classic when Ordered). Quorum queues count redeliveries
//     (x-delivery-count), which [Receiver] reports as Attempt, and redeliver a requeued
//     message before the others. Do not give it a delivery-limit at or below the
//     consumer's MaxAttempts (RabbitMQ 4 sets 20 by default): the broker would drop or
//     dead-letter the message itself instead of txoutbox's dead-letter table getting it.
//   - One retry queue per delay (Queue + ".retry." + delay, see [RetryQueueName]): a quorum
//     queue whose per-queue TTL is the delay and whose dead-letter target is Queue, with
//     at-least-once dead-lettering, so a message that waited there returns to Queue and is
//     never lost on the way. A per-queue TTL (rather than per-message) means messages
//     expire in the order they came: one long delay never holds up a short one.
type Topology struct {
	// Exchange is declared as a durable exchange of ExchangeKind. Default [DefaultExchange].
	Exchange string
	// ExchangeKind is "topic" (the default), "direct", "fanout" or "headers".
	ExchangeKind string
	// Queue names the consumer's queue. Required.
	Queue string
	// Bindings are the routing keys (topic patterns for a topic exchange) Queue is bound
	// with. Default ["#"]: every message of the exchange.
	Bindings []string
	// Ordered makes Queue a single-active-consumer classic queue: however many receivers
	// consume it, the broker delivers to one at a time, the others standing by to take
	// over, and what a lost consumer left unacknowledged goes back where it was (a RabbitMQ
	// 3.x quorum queue would put it at the back). With [ReceiverConfig].Ordered (one
	// message in flight, retries held in the receiver) this keeps per-key order,
	// redeliveries included, at the cost of all parallelism on the queue. A classic queue
	// does not count redeliveries: after a lost connection Attempt counts one more
	// whatever the number of losses.
	Ordered bool
	// RetryDelays are the delays of the retry queues. Default [DefaultRetryDelays]. Each
	// must be at least 1ms; pass the same list to [ReceiverConfig].RetryDelays.
	RetryDelays []time.Duration
}

func (t Topology) withDefaults() Topology {
	if t.Exchange == "" {
		t.Exchange = DefaultExchange
	}
	if t.ExchangeKind == "" {
		t.ExchangeKind = amqp.ExchangeTopic
	}
	if len(t.Bindings) == 0 {
		t.Bindings = []string{"#"}
	}
	if len(t.RetryDelays) == 0 {
		t.RetryDelays = DefaultRetryDelays
	}
	return t
}

// validate checks a Topology with defaults applied and returns every problem at once.
func (t Topology) validate() error {
	var errs []error
	if err := checkName(t.Exchange); err != nil {
		errs = append(errs, fmt.Errorf("Exchange %q: %w", t.Exchange, err))
	}
	if err := checkName(t.Queue); err != nil {
		errs = append(errs, fmt.Errorf("Queue %q: %w", t.Queue, err))
	}
	switch t.ExchangeKind {
	case amqp.ExchangeTopic, amqp.ExchangeDirect, amqp.ExchangeFanout, amqp.ExchangeHeaders:
	default:
		errs = append(errs, fmt.Errorf("ExchangeKind %q is not topic, direct, fanout or headers", t.ExchangeKind))
	}
	if errs = append(errs, checkRetryDelays(t.Queue, t.RetryDelays)...); len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

func checkRetryDelays(queue string, delays []time.Duration) []error {
	var errs []error
	for _, d := range delays {
		if d < time.Millisecond || d%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("retry delay %v is not a positive whole number of milliseconds", d))
		} else if err := checkName(RetryQueueName(queue, d)); queue != "" && err != nil {
			errs = append(errs, fmt.Errorf("retry queue %q: %w", RetryQueueName(queue, d), err))
		}
	}
	return errs
}

// RetryQueueName is the name of queue's retry queue for delay: "orders.retry.5s",
// "orders.retry.2m", "orders.retry.250ms".
func RetryQueueName(queue string, delay time.Duration) string {
	var d string
	switch {
	case delay%time.Hour == 0:
		d = fmt.Sprintf("%dh", delay/time.Hour)
	case delay%time.Minute == 0:
		d = fmt.Sprintf("%dm", delay/time.Minute)
	case delay%time.Second == 0:
		d = fmt.Sprintf("%ds", delay/time.Second)
	default:
		d = fmt.Sprintf("%dms", delay/time.Millisecond)
	}
	return queue + ".retry." + d
}

// Declare declares t's exchange, queue, bindings and retry queues on ch, and returns
// every problem at once. Declaring what exists with the same settings is a no-op; the
// broker refuses a queue or exchange that exists with other settings (and closes ch).
// It is meant for tests, examples and small deployments.
func Declare(ch *amqp.Channel, t Topology) error {
	t = t.withDefaults()
	err := t.validate()
	if ch == nil {
		err = errors.Join(err, errors.New("no channel"))
	}
	if err != nil {
		return fmt.Errorf("outboxrabbitmq: Declare: %w", err)
	}
	if err := ch.ExchangeDeclare(t.Exchange, t.ExchangeKind, true, false, false, false, nil); err != nil {
		return fmt.Errorf("outboxrabbitmq: declaring exchange %q: %w", t.Exchange, err)
	}
	args := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	if t.Ordered {
		// A classic queue puts back what a lost consumer had unacknowledged where it was;
		// a RabbitMQ 3.x quorum queue puts it at the back, behind later messages of its key.
		args = amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic, amqp.SingleActiveConsumerArg: true}
	}
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("outboxrabbitmq: declaring queue %q: %w", t.Queue, err)
	}
	for _, key := range t.Bindings {
		if err := ch.QueueBind(t.Queue, key, t.Exchange, false, nil); err != nil {
			return fmt.Errorf("outboxrabbitmq: binding queue %q to exchange %q with key %q: %w", t.Queue, t.Exchange, key, err)
		}
	}
	for _, d := range t.RetryDelays {
		name := RetryQueueName(t.Queue, d)
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
			amqp.QueueMessageTTLArg:     d.Milliseconds(),
			"x-dead-letter-exchange":    "", // the default exchange: routing key = queue name
			"x-dead-letter-routing-key": t.Queue,
			"x-dead-letter-strategy":    "at-least-once",
			amqp.QueueOverflowArg:       amqp.QueueOverflowRejectPublish, // at-least-once needs it
		}); err != nil {
			return fmt.Errorf("outboxrabbitmq: declaring retry queue %q: %w", name, err)
		}
	}
	return nil
}

// QueueNames returns every queue t declares: its queue, then its retry queues.
func (t Topology) QueueNames() []string {
	t = t.withDefaults()
	names := []string{t.Queue}
	for _, d := range t.RetryDelays {
		names = append(names, RetryQueueName(t.Queue, d))
	}
	return names
}

// retryTier returns the delay of the retry queue for a requested delay: the smallest
// that is not shorter, or the longest.
func retryTier(delays []time.Duration, want time.Duration) time.Duration {
	sorted := slices.Sorted(slices.Values(delays))
	for _, d := range sorted {
		if d >= want {
			return d
		}
	}
	return sorted[len(sorted)-1]
}
