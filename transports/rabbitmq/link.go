package outboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/backoff"
)

// Connection says how a [Sender] or [Receiver] reaches the broker, and how it reconnects.
// Each Sender and Receiver keeps a connection of its own (RabbitMQ throttles publishing
// connections under a resource alarm; a consumer's connection should not be the one
// throttled), dials it on first use, and redials after a loss.
type Connection struct {
	// URL is the broker's AMQP URI, amqp://user:password@host:5672/vhost (amqps:// for TLS).
	// Required. It is never logged or put in an error: only host, port and vhost are.
	URL string
	// AMQP tunes the connection (TLS, SASL, heartbeat, channel and frame limits, client
	// properties). Zero fields take amqp091-go's defaults; the connection_name property
	// defaults to "txoutbox sender" or "txoutbox receiver". Its Recovery must stay nil:
	// amqp091-go's own recovery reuses channel objects after a reconnect, so an old
	// delivery's ack would acknowledge a different message; this package redials itself.
	AMQP amqp.Config
	// ReconnectBackoff is the wait before the first redial after a failed dial, doubling
	// (with jitter) per failure up to MaxReconnectBackoff. A call that finds the
	// connection down redials at once unless a dial failed within the backoff; it then
	// waits for the next attempt if its context allows, and otherwise fails with the last
	// dial error. Defaults 100ms and 10s.
	ReconnectBackoff    time.Duration
	MaxReconnectBackoff time.Duration
	// DialTimeout bounds one dial, TCP connect and AMQP handshake (a call's context
	// deadline, when sooner, bounds it too). Default 30s.
	DialTimeout time.Duration
	// Logger receives connection losses and reconnects. Default slog.Default().
	Logger *slog.Logger
}

func (c Connection) withDefaults(name string) Connection {
	if c.ReconnectBackoff == 0 {
		c.ReconnectBackoff = 100 * time.Millisecond
	}
	if c.MaxReconnectBackoff == 0 {
		c.MaxReconnectBackoff = 10 * time.Second
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	props := amqp.NewConnectionProperties()
	for k, v := range c.AMQP.Properties {
		props[k] = v
	}
	if _, ok := props["connection_name"]; !ok {
		props.SetClientConnectionName(name)
	}
	c.AMQP.Properties = props
	return c
}

// validate checks a Connection with defaults applied and returns every problem at once.
func (c Connection) validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("URL is empty"))
	} else if _, err := amqp.ParseURI(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("URL is not an AMQP URI: %w", redact(err, c.URL)))
	}
	if c.AMQP.Recovery != nil {
		errs = append(errs, errors.New("AMQP.Recovery is set: amqp091-go's recovery would let an old delivery's ack settle another message; leave it nil (the sender and receiver redial themselves)"))
	}
	if c.ReconnectBackoff < 0 || c.MaxReconnectBackoff < c.ReconnectBackoff {
		errs = append(errs, fmt.Errorf("backoffs must satisfy 0 <= ReconnectBackoff (%v) <= MaxReconnectBackoff (%v)", c.ReconnectBackoff, c.MaxReconnectBackoff))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("DialTimeout %v is negative", c.DialTimeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("outboxrabbitmq: invalid Connection: %w", errors.Join(errs...))
	}
	return nil
}

// redact removes the URL (and so its password) from err's text.
func redact(err error, url string) error {
	if err == nil || url == "" {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), url, "<url>"))
}

// link is one broker connection that is redialled after a loss, no sooner than its
// backoff allows after a failed dial.
type link struct {
	cfg   Connection
	where string // host:port[/vhost], for errors and logs

	dialing chan struct{} // held while dialing: one dial at a time, waited for with a context

	mu       sync.Mutex
	conn     *amqp.Connection
	failures int       // dials failed in a row
	next     time.Time // no dial before this
	lastErr  error
	blocked  string // why the broker blocks publishing on conn, "" when it does not
	closed   bool
	dials    int // successful dials
	watchers sync.WaitGroup
}

func newLink(c Connection) *link {
	where := "(unparsed URL)"
	if u, err := amqp.ParseURI(c.URL); err == nil {
		where = fmt.Sprintf("%s:%d", u.Host, u.Port)
		if u.Vhost != "/" {
			where += "/" + u.Vhost
		}
	}
	return &link{cfg: c, where: where, dialing: make(chan struct{}, 1)}
}

// errLinkClosed is returned by a link used after Close.
var errLinkClosed = fmt.Errorf("outboxrabbitmq: %w", outbox.ErrClosed)

// connection returns the open connection, dialling one if there is none. A dial that
// fails, for whatever reason (refused, DNS, TLS, credentials, vhost), fails with an error
// marked outbox.Unavailable: the broker's fault or the connection's, never a message's.
func (l *link) connection(ctx context.Context) (*amqp.Connection, error) {
	if c, err := l.current(); c != nil || err != nil {
		return c, err
	}
	select {
	case l.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, markBrokerFault(fmt.Errorf("outboxrabbitmq: waiting to connect to %s: %w", l.where, ctx.Err()))
	}
	defer func() { <-l.dialing }()
	if c, err := l.current(); c != nil || err != nil { // another caller dialled meanwhile
		return c, err
	}

	l.mu.Lock()
	wait, lastErr := time.Until(l.next), l.lastErr
	l.mu.Unlock()
	if wait > 0 {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return nil, outbox.Unavailable(fmt.Errorf("outboxrabbitmq: broker at %s unreachable, next dial in %v: %w", l.where, wait.Round(time.Millisecond), lastErr))
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, outbox.Unavailable(fmt.Errorf("outboxrabbitmq: broker at %s unreachable (%w): %w", l.where, lastErr, ctx.Err()))
		}
	}

	timeout := l.cfg.DialTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	cfg := l.cfg.AMQP
	if cfg.Dial == nil {
		cfg.Dial = amqp.DefaultDial(timeout)
	}
	conn, err := amqp.DialConfig(l.cfg.URL, cfg)

	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failures++
		l.lastErr = redact(err, l.cfg.URL)
		l.next = time.Now().Add(backoff.Delay(l.failures, l.cfg.ReconnectBackoff, l.cfg.MaxReconnectBackoff))
		return nil, outbox.Unavailable(fmt.Errorf("outboxrabbitmq: connecting to %s: %w", l.where, l.lastErr))
	}
	if l.closed {
		_ = conn.Close()
		return nil, errLinkClosed
	}
	if l.dials > 0 {
		l.cfg.Logger.Info("outboxrabbitmq: reconnected", "broker", l.where, "after_failed_dials", l.failures)
	}
	l.conn, l.failures, l.lastErr, l.blocked, l.next = conn, 0, nil, "", time.Time{}
	l.dials++
	l.watch(conn)
	return conn, nil
}

// current returns the open connection, nil if there is none, or an error once closed.
func (l *link) current() (*amqp.Connection, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errLinkClosed
	}
	if l.conn != nil && !l.conn.IsClosed() {
		return l.conn, nil
	}
	return nil, nil
}

// watch logs conn's loss and tracks the broker's connection.blocked notices until conn
// closes.
func (l *link) watch(conn *amqp.Connection) {
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	l.watchers.Go(func() {
		for {
			select {
			case err, ok := <-closed:
				if ok && err != nil {
					l.cfg.Logger.Warn("outboxrabbitmq: connection lost", "broker", l.where, "err", err)
				}
				for range blocked { // closed with the connection
				}
				return
			case b, ok := <-blocked:
				if !ok {
					blocked = nil
					continue
				}
				l.mu.Lock()
				if l.conn == conn {
					l.blocked = ""
					if b.Active {
						l.blocked = b.Reason
					}
				}
				l.mu.Unlock()
				if b.Active {
					l.cfg.Logger.Warn("outboxrabbitmq: the broker blocks publishing on this connection", "broker", l.where, "reason", b.Reason)
				}
			}
		}
	})
}

// blockedReason says why the broker blocks publishing on conn, or "" if it does not.
func (l *link) blockedReason(conn *amqp.Connection) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != conn {
		return ""
	}
	return l.blocked
}

// closeChannel closes ch in the background: channel.close waits for the broker's reply,
// which a half-dead connection never sends (the connection's close, at the latest, ends
// the wait).
func (l *link) closeChannel(ch *amqp.Channel) {
	if ch.IsClosed() {
		return
	}
	l.watchers.Go(func() { _ = ch.Close() })
}

// reconnects returns how many times the link dialled after its first connection.
func (l *link) reconnects() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(0, l.dials-1)
}

// close closes the connection and waits for its watcher; the link cannot be used after.
func (l *link) close() error {
	l.mu.Lock()
	conn := l.conn
	l.closed, l.conn = true, nil
	l.mu.Unlock()
	var err error
	if conn != nil && !conn.IsClosed() {
		// A broker that stopped answering would hold a plain Close until the heartbeat
		// timeout.
		if err = conn.CloseDeadline(time.Now().Add(5 * time.Second)); errors.Is(err, amqp.ErrClosed) {
			err = nil
		}
	}
	l.watchers.Wait()
	return err
}
