package telemetry

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// TestLogLimiterCountsWhatItSuppresses: past Burst lines in a window, lines are suppressed
// and counted; the first line of the next window carries the count.
func TestLogLimiterCountsWhatItSuppresses(t *testing.T) {
	clock := time.Unix(1e9, 0)
	l := LogLimiter{Burst: 2, Window: time.Second, now: func() time.Time { return clock }}
	for i := range 2 {
		if ok, n := l.Allow(); !ok || n != 0 {
			t.Fatalf("line %d: allowed %v, suppressed %d", i+1, ok, n)
		}
	}
	for range 5 {
		if ok, _ := l.Allow(); ok {
			t.Fatal("a line past the burst was allowed")
		}
	}
	clock = clock.Add(time.Second)
	if ok, n := l.Allow(); !ok || n != 5 {
		t.Fatalf("next window: allowed %v, suppressed %d, want true, 5", ok, n)
	}
}

// TestSetsAllocateNothingOnceSeen: a cached attribute set records without allocating.
func TestSetsAllocateNothingOnceSeen(t *testing.T) {
	s := NewSets(func(k Key) []attribute.KeyValue { return []attribute.KeyValue{attribute.String("a", k.A)} })
	s.get(Key{A: "x"})
	if n := testing.AllocsPerRun(100, func() { s.get(Key{A: "x"}) }); n != 0 {
		t.Fatalf("%v allocations per cached lookup", n)
	}
}
