package main

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// privateLabels are the labels of the relay's metrics that say what the application sends
// where: its event types and its queues, topics or subjects. /metrics leaves them out for
// callers that did not authenticate.
var privateLabels = []string{"cloudevents_event_type", "messaging_destination_name"}

// withoutLabels gathers g's metrics without the labels drop: series that differed only by
// them are added up (counters, gauges, histograms), so the totals stay right.
func withoutLabels(g prometheus.Gatherer, drop ...string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		families, err := g.Gather()
		for _, f := range families {
			merged := map[string]*dto.Metric{}
			var out []*dto.Metric
			for _, m := range f.Metric {
				labels := slices.DeleteFunc(slices.Clone(m.Label), func(l *dto.LabelPair) bool { return slices.Contains(drop, l.GetName()) })
				var key strings.Builder
				for _, l := range labels {
					key.WriteString(l.GetName() + "\x00" + l.GetValue() + "\x00")
				}
				if into, ok := merged[key.String()]; ok {
					addMetric(into, m)
					continue
				}
				c := copyMetric(m)
				c.Label = labels
				merged[key.String()] = c
				out = append(out, c)
			}
			f.Metric = out
		}
		return families, err
	})
}

// copyMetric copies the values of m that addMetric changes (exemplars are left out: they
// would name one series).
func copyMetric(m *dto.Metric) *dto.Metric {
	c := &dto.Metric{TimestampMs: m.TimestampMs}
	if v := m.Counter; v != nil {
		c.Counter = &dto.Counter{Value: f64(v.GetValue()), CreatedTimestamp: v.CreatedTimestamp}
	}
	if v := m.Gauge; v != nil {
		c.Gauge = &dto.Gauge{Value: f64(v.GetValue())}
	}
	if v := m.Untyped; v != nil {
		c.Untyped = &dto.Untyped{Value: f64(v.GetValue())}
	}
	if v := m.Summary; v != nil {
		c.Summary = v // not merged: the exporter writes none
	}
	if v := m.Histogram; v != nil {
		h := &dto.Histogram{SampleCount: u64(v.GetSampleCount()), SampleSum: f64(v.GetSampleSum()), CreatedTimestamp: v.CreatedTimestamp}
		for _, b := range v.Bucket {
			h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: f64(b.GetUpperBound()), CumulativeCount: u64(b.GetCumulativeCount())})
		}
		c.Histogram = h
	}
	return c
}

// addMetric adds m's values to into's.
func addMetric(into, m *dto.Metric) {
	switch {
	case into.Counter != nil:
		*into.Counter.Value += m.GetCounter().GetValue()
	case into.Gauge != nil:
		*into.Gauge.Value += m.GetGauge().GetValue()
	case into.Untyped != nil:
		*into.Untyped.Value += m.GetUntyped().GetValue()
	case into.Histogram != nil:
		h := m.GetHistogram()
		*into.Histogram.SampleCount += h.GetSampleCount()
		*into.Histogram.SampleSum += h.GetSampleSum()
		for _, b := range h.GetBucket() { // one instrument: the same bounds
			for _, ib := range into.Histogram.Bucket {
				if ib.GetUpperBound() == b.GetUpperBound() {
					*ib.CumulativeCount += b.GetCumulativeCount()
				}
			}
		}
	}
}

func f64(v float64) *float64 { return &v }
func u64(v uint64) *uint64   { return &v }
