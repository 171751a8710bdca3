package exporter

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// desc is a metric's descriptor with what its samples need to write their
// label pairs cheaply.
type desc struct {
	d     *prometheus.Desc
	names []*string // label names, sorted as the exposition wants them
	order []int     // order[i]: index, in the values given, of the i-th sorted label
}

// descs lists every metric's descriptor, for Describe.
var descs []*prometheus.Desc

func newDesc(name, help string, labels ...string) *desc {
	if len(labels) > maxLabels {
		panic("exporter: more labels than maxLabels: " + name)
	}
	d := &desc{d: prometheus.NewDesc("backstop_"+name, help, labels, nil)}
	sorted := slices.Clone(labels)
	slices.Sort(sorted)
	for _, l := range sorted {
		d.names = append(d.names, &l)
		d.order = append(d.order, slices.Index(labels, l))
	}
	descs = append(descs, d.d)
	return d
}

// sample is a gauge, counter or histogram sample: what
// prometheus.MustNewConstMetric and MustNewConstHistogram make, at a third
// of the allocations. A scrape of 1,000 queues makes some 23,000 samples
// and their label pairs were most of its garbage. Label values must be
// valid UTF-8 (the sink checks).
type sample struct {
	desc   *desc
	typ    prometheus.ValueType // GaugeValue or CounterValue; unused by histograms
	value  float64
	labels []string

	histogram bool
	count     uint64
	bounds    []float64 // shared, read-only
	cum       []uint64  // cumulative count of each bound
}

func (s *sample) Desc() *prometheus.Desc { return s.desc.d }

// Write fills out with pointers into s: the sample is never changed after
// it is made, so concurrent scrapes sharing it may write it at once.
func (s *sample) Write(out *dto.Metric) error {
	l := new(labels) // one allocation for all the label pairs
	out.Label = l.ptrs[:len(s.labels)]
	for i, j := range s.desc.order {
		l.pairs[i].Name, l.pairs[i].Value = s.desc.names[i], &s.labels[j]
		l.ptrs[i] = &l.pairs[i]
	}
	switch {
	case s.histogram:
		h := &dto.Histogram{SampleCount: &s.count, SampleSum: &s.value, Bucket: make([]*dto.Bucket, len(s.bounds))}
		buckets := make([]dto.Bucket, len(s.bounds))
		for i := range s.bounds {
			buckets[i].UpperBound, buckets[i].CumulativeCount = &s.bounds[i], &s.cum[i]
			h.Bucket[i] = &buckets[i]
		}
		out.Histogram = h
	case s.typ == prometheus.CounterValue:
		out.Counter = &dto.Counter{Value: &s.value}
	default:
		out.Gauge = &dto.Gauge{Value: &s.value}
	}
	return nil
}

// maxLabels is the most labels a backstop metric has (queue and group,
// outcome or reason).
const maxLabels = 2

type labels struct {
	pairs [maxLabels]dto.LabelPair
	ptrs  [maxLabels]*dto.LabelPair
}
