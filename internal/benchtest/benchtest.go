// Package benchtest holds what the transports' benchmarks share: a Sender wrapper that
// signals when the relay has sent what it was given, and the machine's busy CPU time, for
// CPU per event next to events per second.
package benchtest

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/txoutbox/outbox"
)

// CountingSender passes sends on and signals once the expected number of messages went
// through without error.
type CountingSender struct {
	outbox.Sender
	mu   sync.Mutex
	left int
	done chan struct{}
}

// Expect arms the counter for n messages and returns the channel closed when they are sent.
func (c *CountingSender) Expect(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left, c.done = n, make(chan struct{})
	return c.done
}

// Send sends through the wrapped Sender and counts the messages of a successful call.
func (c *CountingSender) Send(ctx context.Context, msgs []outbox.Message) error {
	err := c.Sender.Send(ctx, msgs)
	if err == nil {
		c.mu.Lock()
		if c.left -= len(msgs); c.left <= 0 && c.done != nil {
			close(c.done)
			c.done = nil
		}
		c.mu.Unlock()
	}
	return err
}

// ClockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux platform Go supports.
const ClockTicks = 100

// BusyJiffies returns the machine's non-idle CPU time from /proc/stat, or -1 off Linux.
func BusyJiffies() int64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return -1
	}
	if len(fields) > 9 {
		fields = fields[:9] // guest time is counted in user time already
	}
	var busy int64
	for i, f := range fields[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return -1
		}
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy
}
