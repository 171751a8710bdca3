package exporter

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// desc is a metric's descriptor with what its samples need to write their
// label pairs cheaply, and what the handler's encoder writes (handler.go).
type desc struct {
	d     *prometheus.Desc
	name  string    // the full name, backstop_…
	help  string    //
	names []*string // label names, sorted as the exposition wants them
	order []int     // order[i]: index, in the values given, of the i-th sorted label
	// typ is CounterValue for a name ending in _total, UntypedValue for a
	// histogram (asHistogram), else GaugeValue: a sample takes its type
	// from its desc, which keeps samples at 64 bytes.
	typ prometheus.ValueType
	idx int // its index in descs
}

// descs lists every metric's descriptor, for Describe.
var descs []*desc

func newDesc(name, help string, labels ...string) *desc {
	if len(labels) > maxLabels {
		panic("exporter: more labels than maxLabels: " + name)
	}
	d := &desc{d: prometheus.NewDesc("backstop_"+name, help, labels, nil), name: "backstop_" + name, help: help, typ: prometheus.GaugeValue}
	if strings.HasSuffix(name, "_total") {
		d.typ = prometheus.CounterValue
	}
	sorted := slices.Clone(labels)
	slices.Sort(sorted)
	for _, l := range sorted {
		d.names = append(d.names, &l)
		d.order = append(d.order, slices.Index(labels, l))
	}
	d.idx = len(descs)
	descs = append(descs, d)
	return d
}

// asHistogram marks d as a histogram's.
func (d *desc) asHistogram() *desc {
	d.typ = prometheus.UntypedValue
	return d
}

// label returns the value of the i-th label of s in sorted order.
func (s *sample) label(i int) string { return s.labels[s.desc.order[i]] }

// sample is a gauge, counter or histogram sample: what
// prometheus.MustNewConstMetric and MustNewConstHistogram make, in 64
// bytes and no allocation of its own (samples live in the chunks of a
// samples). A scrape of 50,000 queues makes about a million of them, which
// are most of what a scrape keeps in memory. Label values must be valid
// UTF-8 (the readers check). Its type is its desc's.
type sample struct {
	desc   *desc
	value  float64           // a gauge's or counter's value; a histogram's index in samples.hists
	labels [maxLabels]string // in the order the desc was declared with
}

// hist is the rest of a histogram sample.
type hist struct {
	count  uint64
	sum    float64
	bounds []float64 // shared, read-only
	cum    []uint64  // cumulative count of each bound
}

func (s *sample) Desc() *prometheus.Desc { return s.desc.d }

// Write fills out with pointers into s: the sample is never changed after
// it is made, so concurrent scrapes sharing it may write it at once.
func (s *sample) Write(out *dto.Metric) error { return s.write(out, nil) }

// histMetric is a histogram sample with its hist, as Collect sends it.
type histMetric struct {
	s *sample
	h *hist
}

func (m histMetric) Desc() *prometheus.Desc      { return m.s.desc.d }
func (m histMetric) Write(out *dto.Metric) error { return m.s.write(out, m.h) }

func (s *sample) write(out *dto.Metric, h *hist) error {
	n := len(s.desc.names)
	l := new(labels) // one allocation for all the label pairs
	out.Label = l.ptrs[:n]
	for i, j := range s.desc.order {
		l.pairs[i].Name, l.pairs[i].Value = s.desc.names[i], &s.labels[j]
		l.ptrs[i] = &l.pairs[i]
	}
	switch {
	case h != nil:
		dh := &dto.Histogram{SampleCount: &h.count, SampleSum: &h.sum, Bucket: make([]*dto.Bucket, len(h.bounds))}
		buckets := make([]dto.Bucket, len(h.bounds))
		for i := range h.bounds {
			buckets[i].UpperBound, buckets[i].CumulativeCount = &h.bounds[i], &h.cum[i]
			dh.Bucket[i] = &buckets[i]
		}
		out.Histogram = dh
	case s.desc.typ == prometheus.CounterValue:
		out.Counter = &dto.Counter{Value: &s.value}
	default:
		out.Gauge = &dto.Gauge{Value: &s.value}
	}
	return nil
}

// maxLabels is the most labels a backstop metric has (queue, outcome or
// reason, and job_type).
const maxLabels = 3

type labels struct {
	pairs [maxLabels]dto.LabelPair
	ptrs  [maxLabels]*dto.LabelPair
}

// samples holds one scrape's samples in chunks that never move: adding
// never copies what is there (a slice doubling would hold up to three
// times the samples while it grows), and a chunk is one allocation for
// many samples. It is read-only once the scrape is done.
type samples struct {
	chunks [][]sample
	n      int
	hists  []*hist // the histograms' rest, by the index in their sample's value
}

// metric returns s as a prometheus.Metric.
func (ss *samples) metric(s *sample) prometheus.Metric {
	if h := ss.hist(s); h != nil {
		return histMetric{s, h}
	}
	return s
}

// hist returns the rest of s when s is a histogram's sample, else nil.
func (ss *samples) hist(s *sample) *hist {
	if s.desc.typ != prometheus.UntypedValue {
		return nil
	}
	return ss.hists[int(s.value)]
}

// Chunks grow from minChunk to maxChunk samples (256 KiB).
const (
	minChunk = 64
	maxChunk = 4096
)

// add returns a new zero sample to fill in.
func (ss *samples) add() *sample {
	last := len(ss.chunks) - 1
	if last < 0 || len(ss.chunks[last]) == cap(ss.chunks[last]) {
		ss.chunks = append(ss.chunks, make([]sample, 0, min(maxChunk, max(minChunk, ss.n))))
		last++
	}
	ss.chunks[last] = ss.chunks[last][:len(ss.chunks[last])+1]
	ss.n++
	return &ss.chunks[last][len(ss.chunks[last])-1]
}

// all calls f with every sample, in the order they were added.
func (ss *samples) all(f func(*sample)) {
	if ss == nil { // the scrape panicked
		return
	}
	for _, c := range ss.chunks {
		for i := range c {
			f(&c[i])
		}
	}
}
