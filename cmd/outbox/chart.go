package main

import (
	"context"
	"fmt"
	"time"

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// chart is the status page's stacked bar chart of dead letters by kind over time, drawn as
// inline SVG by the template: the numbers are computed here.
type chart struct {
	Range                    string
	Width, Height            int
	Left, Right, Top, Bottom int
	Max                      int64
	Bars                     []bar
	Ticks                    []tick
	Legend                   []legendItem
}

type bar struct {
	X, Y, W, H   float64
	Color, Label string
}

type tick struct {
	X     float64
	Label string
}

type legendItem struct {
	Kind, Color string
	Count       int64
}

// kindColors gives each kind a color (a colorblind-aware palette); unclassified is grey.
var kindColors = map[deadletter.Kind]string{
	deadletter.KindGaveUp: "#e15759", deadletter.KindPermanent: "#f28e2b", deadletter.KindTooLarge: "#edc948",
	deadletter.KindUnreadableRow: "#b07aa1", deadletter.KindMalformed: "#76b7b2", deadletter.KindUnknownType: "#4e79a7",
	deadletter.KindUndecodable: "#59a14f", deadletter.KindHeld: "#ff9da7", deadletter.KindBlobMissing: "#9d7660", "": "#9c9c9c",
}

// ranges are the chart's spans and the width of one bar in each.
var ranges = map[string]struct{ span, step time.Duration }{
	"24h": {24 * time.Hour, time.Hour},
	"7d":  {7 * 24 * time.Hour, 6 * time.Hour},
	"30d": {30 * 24 * time.Hour, 24 * time.Hour},
}

// history reads the dead-letter history for span ("24h" by default) up to now and lays out
// its chart.
func (c *console) history(ctx context.Context, span string, now time.Time) (*chart, error) {
	if _, ok := ranges[span]; !ok {
		span = "24h"
	}
	rg := ranges[span]
	step := int64(rg.step / time.Second)
	first := (now.Add(-rg.span).Unix()/step + 1) * step
	buckets, err := sqlstore.DeadLetterHistory(ctx, c.s.dialect, c.s.q, c.s.names, time.Unix(first, 0), rg.step)
	if err != nil {
		return nil, err
	}
	n := int((now.Unix()-first)/step) + 1
	ch := &chart{Range: span, Width: 760, Height: 220, Left: 36, Right: 750, Top: 16, Bottom: 196}
	totals := make([]int64, n)
	perKind := map[string]int64{}
	for _, b := range buckets {
		i := int((b.Start.Unix() - first) / step)
		if i < 0 || i >= n {
			continue
		}
		totals[i] += b.Count
		perKind[b.Kind] += b.Count
	}
	ch.Max = 1
	for _, t := range totals {
		ch.Max = max(ch.Max, t)
	}
	slot := float64(ch.Right-ch.Left) / float64(n)
	scale := float64(ch.Bottom-ch.Top) / float64(ch.Max)
	stacked := make([]int64, n)
	for _, kind := range orderedKinds(perKind) {
		for _, b := range buckets {
			i := int((b.Start.Unix() - first) / step)
			if b.Kind != kind || i < 0 || i >= n {
				continue
			}
			y := float64(ch.Bottom) - float64(stacked[i]+b.Count)*scale
			ch.Bars = append(ch.Bars, bar{
				X: float64(ch.Left) + float64(i)*slot + slot*0.1, Y: y, W: slot * 0.8, H: float64(b.Count) * scale,
				Color: kindColors[deadletter.Kind(kind)], Label: fmt.Sprintf("%s: %d %s", b.Start.UTC().Format("2006-01-02 15:04Z"), b.Count, orDash(kind)),
			})
			stacked[i] += b.Count
		}
	}
	for i := 0; i < n; i += max(n/6, 1) {
		t := time.Unix(first+int64(i)*step, 0).UTC()
		label := t.Format("Jan 2")
		if rg.step < 24*time.Hour {
			label = t.Format("Jan 2 15:04")
		}
		ch.Ticks = append(ch.Ticks, tick{X: float64(ch.Left) + float64(i)*slot, Label: label})
	}
	for _, k := range orderedKinds(perKind) {
		ch.Legend = append(ch.Legend, legendItem{Kind: orDash(k), Color: kindColors[deadletter.Kind(k)], Count: perKind[k]})
	}
	return ch, nil
}

// orderedKinds lists the kinds present in the order of the deadletter package, unknown
// ones last.
func orderedKinds(present map[string]int64) []string {
	var out []string
	seen := map[string]bool{}
	for _, k := range kinds {
		if _, ok := present[string(k)]; ok {
			out = append(out, string(k))
			seen[string(k)] = true
		}
	}
	for k := range present {
		if !seen[k] {
			out = append(out, k)
		}
	}
	return out
}
