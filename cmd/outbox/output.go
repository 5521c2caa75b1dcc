package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns. Every cell is made safe for a terminal first (see clean).
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = strings.ReplaceAll(clean(c), "\t", " ")
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() { t.tw.Flush() }

// clean makes text from the database safe to print on a terminal or a page: a reason, a
// type or a payload may hold anything. Escape sequences must not drive the operator's
// terminal (C0 and C1 controls: ESC, CSI U+009B, OSC U+009D…), and text must not display
// as something it is not (bidi overrides such as U+202E, zero-width and other format
// characters, line separators, invalid UTF-8). When s holds any of them, it is shown
// escaped, as Go quotes strings; other text is left as it is.
func clean(s string) string {
	if !strings.ContainsFunc(s, unsafeRune) && utf8.ValidString(s) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// unsafeRune reports whether r must not reach a terminal or a page as it is: anything
// strconv.Quote would escape but a tab (controls, format characters such as bidi overrides
// and zero-width ones, separators other than the space, unassigned code points).
func unsafeRune(r rune) bool {
	return r != '\t' && (r == utf8.RuneError || !strconv.IsPrint(r))
}

// cleanBlock is clean for multi-line text (a pretty-printed payload): newlines stay.
func cleanBlock(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = clean(l)
	}
	return strings.Join(lines, "\n")
}

// cut shortens s to n characters with a trailing "…".
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// age formats a duration for people: 3m12s, 2h05m, 4d03h.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// stamp formats a time in UTC, or "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// count formats n with thousands separators: 10,000.
func count[T ~int | ~int64](n T) string {
	s := strconv.FormatInt(int64(n), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// progress reports a long action on stderr: a bar redrawn in place on a terminal, a plain
// line every 10% (and at most every 2 s) otherwise, nothing in quiet mode.
type progress struct {
	w         io.Writer
	mode      string // "bar", "lines" or "none"
	verb      string
	total     int
	start     time.Time
	mu        sync.Mutex
	lastDraw  time.Time
	lastShown int
}

// newProgress starts a progress report. mode "auto" is a bar when stderr is a terminal.
func (a *app) newProgress(mode, verb string, total int) *progress {
	if mode == "auto" {
		mode = "lines"
		if a.stderrTerminal {
			mode = "bar"
		}
	}
	return &progress{w: a.stderr, mode: mode, verb: verb, total: total, start: time.Now()}
}

// update reports done of total; it draws at most every 100 ms (bar) or 2 s / 10 % (lines),
// and always the last one.
func (p *progress) update(done int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	last := done == p.total
	switch p.mode {
	case "bar":
		if !last && now.Sub(p.lastDraw) < 100*time.Millisecond {
			return
		}
		const width = 30
		filled := 0
		if p.total > 0 {
			filled = done * width / p.total
		}
		fmt.Fprintf(p.w, "\r%s [%s%s] %s/%s %3d%% %s", p.verb, strings.Repeat("#", filled), strings.Repeat(".", width-filled),
			count(done), count(p.total), percent(done, p.total), p.rate(done, now))
		if last {
			fmt.Fprintln(p.w)
		}
	case "lines":
		step := max(p.total/10, 1)
		if !last && (done-p.lastShown < step || now.Sub(p.lastDraw) < 2*time.Second) {
			return
		}
		fmt.Fprintf(p.w, "%s %s of %s (%d%%), %s\n", p.verb, count(done), count(p.total), percent(done, p.total), p.rate(done, now))
		p.lastShown = done
	default:
		return
	}
	p.lastDraw = now
}

func percent(done, total int) int {
	if total == 0 {
		return 100
	}
	return done * 100 / total
}

func (p *progress) rate(done int, now time.Time) string {
	secs := now.Sub(p.start).Seconds()
	if secs <= 0 {
		return "-/s"
	}
	return count(int64(float64(done)/secs)) + "/s"
}
