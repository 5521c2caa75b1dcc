// Package benchtest holds what the benchmarks share: a Sender wrapper that signals when the
// relay has sent what it was given, CPU time read from /proc (the machine's, or some
// processes'), Rounds, which runs a benchmark's paths in turns and reports events/s and CPU
// per event of each, and DrainKeys, which drains keyed backlogs (drain.go).
package benchtest

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/relay"
)

// CountingSender passes sends on and signals once the expected number of messages went
// through without error.
type CountingSender struct {
	outbox.Sender
	mu   sync.Mutex
	left int
	sent int64
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
		c.sent += int64(len(msgs))
		if c.left -= len(msgs); c.left <= 0 && c.done != nil {
			close(c.done)
			c.done = nil
		}
		c.mu.Unlock()
	}
	return err
}

// KeepsKeyOrder forwards the wrapped Sender's answer ([outbox.KeyOrderer]).
func (c *CountingSender) KeepsKeyOrder() bool { return outbox.KeepsKeyOrder(c.Sender) }

// Sent returns how many messages went through without error so far.
func (c *CountingSender) Sent() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent
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

// Meter reads a CPU time in clock ticks (USER_HZ), or -1 when it cannot, for [Rounds] to
// report per event under its name.
type Meter struct {
	Name string
	Read func() int64
}

// Processes meters the processes whose command name (/proc/PID/comm) is one of names,
// counting their children that exited too (a PostgreSQL backend or autovacuum worker that
// ended is counted in the server's children time); "self" names this process.
func Processes(name string, names ...string) Meter {
	names = append(names, name)
	return Meter{Name: name, Read: func() int64 {
		self := os.Getpid()
		return sumStat(func(pid int, comm string) bool {
			for _, n := range names {
				if n == comm || (n == "self" && pid == self) {
					return true
				}
			}
			return false
		})
	}}
}

// PIDs meters the processes pids returns at each reading (a benchmark's own database
// backends, found by their application_name): unlike the server's, their time is not
// shared with whatever else uses the server.
func PIDs(name string, pids func() []int) Meter {
	return Meter{Name: name, Read: func() int64 {
		want := pids()
		if want == nil {
			return -1
		}
		return sumStat(func(pid int, _ string) bool { return slices.Contains(want, pid) })
	}}
}

// sumStat adds up the user and system time, own and of exited children, of the processes
// match picks; -1 off Linux.
func sumStat(match func(pid int, comm string) bool) int64 {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	var total int64
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid …": comm may hold spaces and parentheses, so cut at the last ')'.
		s := string(raw)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || !match(pid, s[open+1:end]) {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 15 {
			continue
		}
		for _, f := range fields[11:15] { // utime, stime, cutime, cstime
			v, _ := strconv.ParseInt(f, 10, 64)
			total += v
		}
	}
	return total
}

// Path is one way of getting events to the broker that a benchmark compares with others.
type Path struct {
	Name string
	// Prepare readies n events untimed and returns the timed part, which sends them.
	Prepare func(n int) func()

	spent time.Duration
	cpu   []int64 // per meter; -1 when unknown
}

// Rounds sends b.N events by each path, the paths taking turns in rounds of round events
// so that load from elsewhere on the machine weighs on all of them alike, and reports each
// path's events/s ("<path>-ev/s"), the machine's busy CPU time per event
// ("<path>-cpu-µs/ev": what bounds the rates when everything shares the machine, though it
// includes whatever else runs) and that of each meter ("<path>-<meter>-µs/ev": only what
// those processes did). It returns the rates by path name, for the benchmark's ratios.
func Rounds(b *testing.B, round int, meters []Meter, paths ...*Path) map[string]float64 {
	b.Helper()
	if b.N < round {
		// CPU is counted in clock ticks and a relay needs a few batches to reach its pace:
		// a handful of events gives numbers, but not ones that mean anything.
		b.Logf("b.N = %d events per path: too few to rate; run with -benchtime %dx or more", b.N, 5*round)
	}
	meters = append([]Meter{{Name: "cpu", Read: BusyJiffies}}, meters...)
	read := func() []int64 {
		out := make([]int64, len(meters))
		for i, m := range meters {
			out[i] = m.Read()
		}
		return out
	}
	for _, p := range paths {
		p.spent, p.cpu = 0, make([]int64, len(meters))
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		for _, p := range paths {
			b.StopTimer()
			run := p.Prepare(n)
			cpu0 := read()
			b.StartTimer()
			start := time.Now()
			run()
			p.spent += time.Since(start)
			b.StopTimer()
			for i, c1 := range read() {
				if c0 := cpu0[i]; c0 < 0 || c1 < 0 || p.cpu[i] < 0 {
					p.cpu[i] = -1
				} else {
					p.cpu[i] += c1 - c0
				}
			}
			b.StartTimer()
		}
	}
	b.StopTimer()

	rate := map[string]float64{}
	b.ReportMetric(0, "ns/op")
	for _, p := range paths {
		rate[p.Name] = float64(b.N) / p.spent.Seconds()
		b.ReportMetric(rate[p.Name], p.Name+"-ev/s")
		for i, c := range p.cpu {
			if c >= 0 {
				b.ReportMetric(float64(c)*1e6/ClockTicks/float64(b.N), p.Name+"-"+meters[i].Name+"-µs/ev")
			}
		}
	}
	return rate
}

// RelayPath returns the Prepare of a [Path] through a relay (default config but for
// Logger) that drains store into s: it commits n events with commit, untimed, and the timed
// part runs the relay until s has sent them all and Run has returned, every batch written
// back.
func RelayPath(b testing.TB, store outboxdriver.Store, s outbox.Sender, commit func(n int)) func(n int) func() {
	sink := &CountingSender{Sender: s}
	relay, err := relay.New(store, sink, &relay.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	return func(n int) func() {
		commit(n)
		return func() {
			sent := sink.Expect(n)
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() { defer close(ran); _ = relay.Run(ctx) }()
			select {
			case <-sent:
			case <-time.After(2 * time.Minute):
				b.Error("the relay did not send every event within two minutes")
			}
			cancel()
			<-ran
		}
	}
}

// Discard is a Sender that drops what it is given: a relay's own cost, without a broker.
type Discard struct{}

// Send returns nil.
func (Discard) Send(context.Context, []outbox.Message) error { return nil }

// KeepsKeyOrder reports true ([outbox.KeyOrderer]): nothing is sent, so nothing is reordered.
func (Discard) KeepsKeyOrder() bool { return true }

// DiscardInWaves is [Discard] without [outbox.KeyOrderer]: the relay sends it one message of
// each key per call, as it does to a transport that cannot keep key order within a call.
type DiscardInWaves struct{}

// Send returns nil.
func (DiscardInWaves) Send(context.Context, []outbox.Message) error { return nil }
