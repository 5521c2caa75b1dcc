package outboxrabbitmq_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy forwards TCP connections to a broker, so a test can cut a client's connection, or
// stall the broker's replies, without touching the broker that other tests share.
type proxy struct {
	l      net.Listener
	target string

	mu      sync.Mutex
	conns   []net.Conn
	stalled bool
	wg      sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = l.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(b, c); _ = b.Close() })
		p.wg.Go(func() { p.copyReplies(c, b); _ = c.Close() })
	}
}

// copyReplies forwards the broker's bytes to the client, dropping them while stalled.
func (p *proxy) copyReplies(c, b net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := b.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled := p.stalled
			p.mu.Unlock()
			if !stalled {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// stall drops everything the broker sends from now on (confirms, deliveries, heartbeats).
func (p *proxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = true
}

// cut closes every proxied connection, and ends a stall.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns, p.stalled = nil, false
}
