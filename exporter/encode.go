package exporter

import (
	"bufio"
	"bytes"
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// encode writes the samples and the other collectors' families (fams,
// from a Gather) in the text format or, when om, in OpenMetrics, to w:
// byte for byte what client_golang's registry and expfmt write for the
// same metrics (families sorted by name, series by label values), without
// turning every sample into a dto.Metric first. Those were two thirds of
// the memory a scrape held; this keeps the samples and the body only.
//
// A family of fams with the name of one of ours is left out, and its name
// returned: a registry would refuse both.
func encode(w *bufio.Writer, ss *samples, fams []*dto.MetricFamily, om bool) (left []string, err error) {
	// The samples by metric, in one slice sized by a first count: no
	// slice of a metric grows by doubling.
	ends := make([]int, len(descs))
	ss.all(func(s *sample) { ends[s.desc.idx]++ })
	for i := 1; i < len(ends); i++ {
		ends[i] += ends[i-1]
	}
	sorted := make([]*sample, ends[len(ends)-1])
	next := make([]int, len(descs))
	for i := 1; i < len(next); i++ {
		next[i] = ends[i-1]
	}
	ss.all(func(s *sample) {
		sorted[next[s.desc.idx]] = s
		next[s.desc.idx]++
	})
	type family struct {
		name string
		ours []*sample
		dto  *dto.MetricFamily
	}
	all := make([]family, 0, len(descs)+len(fams))
	ours := map[string]bool{}
	for i, d := range descs {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		if ends[i] > start {
			all = append(all, family{name: d.name, ours: sorted[start:ends[i]]})
			ours[d.name] = true
		}
	}
	for _, f := range fams {
		if ours[f.GetName()] {
			left = append(left, f.GetName())
			continue
		}
		all = append(all, family{name: f.GetName(), dto: f})
	}
	slices.SortFunc(all, func(a, b family) int { return strings.Compare(a.name, b.name) })
	e := encoder{w: w, om: om, ss: ss}
	for _, f := range all {
		if f.dto != nil {
			var err error
			if om {
				_, err = expfmt.MetricFamilyToOpenMetrics(w, f.dto)
			} else {
				_, err = expfmt.MetricFamilyToText(w, f.dto)
			}
			if err != nil {
				return left, err
			}
			continue
		}
		e.family(f.ours)
	}
	if om {
		w.WriteString("# EOF\n")
	}
	return left, nil
}

// encoder writes samples as expfmt's MetricFamilyToText and
// MetricFamilyToOpenMetrics do.
type encoder struct {
	w   *bufio.Writer
	om  bool
	num []byte // scratch for numbers
	lbl []byte // a sample's label pairs, written once for all its lines
	ss  *samples
	// les are the le values of the last histogram's bounds, as written.
	les    []string
	bounds []float64
}

// family writes the samples of one metric, sorted by their label values
// as the registry sorts them.
func (e *encoder) family(group []*sample) {
	byLabels := func(a, b *sample) int {
		for i := range a.desc.names {
			if c := cmp.Compare(a.label(i), b.label(i)); c != 0 {
				return c
			}
		}
		return 0
	}
	// The readers add most families in order already (queues by name):
	// checking is a fraction of sorting.
	if !slices.IsSortedFunc(group, byLabels) {
		slices.SortFunc(group, byLabels)
	}
	d := group[0].desc
	name, typ := d.name, "gauge"
	switch {
	case d.typ == prometheus.UntypedValue:
		typ = "histogram"
	case d.typ == prometheus.CounterValue:
		typ = "counter"
		if e.om { // OpenMetrics names the family of a counter x_total x
			name = strings.TrimSuffix(name, "_total")
		}
	}
	w := e.w
	w.WriteString("# HELP ")
	w.WriteString(name)
	w.WriteByte(' ')
	if e.om {
		quotedEscaper.WriteString(w, d.help)
	} else {
		helpEscaper.WriteString(w, d.help)
	}
	w.WriteString("\n# TYPE ")
	w.WriteString(name)
	w.WriteByte(' ')
	w.WriteString(typ)
	w.WriteByte('\n')
	for _, s := range group {
		e.labels(s)
		h := e.ss.hist(s)
		if h == nil {
			e.line(d.name, "", "", s.value, 0, false)
			continue
		}
		les := e.boundLabels(h.bounds)
		for i := range h.bounds {
			e.line(d.name, "_bucket", les[i], 0, h.cum[i], true)
		}
		e.line(d.name, "_bucket", "+Inf", 0, h.count, true)
		e.line(d.name, "_sum", "", h.sum, 0, false)
		e.line(d.name, "_count", "", 0, h.count, true)
	}
}

// labels writes s's label pairs into e.lbl, for each line of s.
func (e *encoder) labels(s *sample) {
	b := e.lbl[:0]
	for i, n := range s.desc.names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, *n...)
		b = append(b, `="`...)
		if v := s.label(i); needsEscape(v) {
			b = append(b, quotedEscaper.Replace(v)...)
		} else {
			b = append(b, v...) // the common case, without the Replacer's overhead
		}
		b = append(b, '"')
	}
	e.lbl = b
}

// boundLabels returns the le values of bounds as written, made once for
// the histograms that share them.
func (e *encoder) boundLabels(bounds []float64) []string {
	if len(bounds) > 0 && len(e.bounds) == len(bounds) && &e.bounds[0] == &bounds[0] {
		return e.les
	}
	e.les = e.les[:0]
	for _, b := range bounds {
		e.num = e.appendFloat(e.num[:0], b)
		e.les = append(e.les, string(e.num))
	}
	e.bounds = bounds
	return e.les
}

// line writes one sample line of the sample whose labels e.lbl holds: the
// name and suffix, the labels and, unless "", the le label, then the
// value: count when isCount, else v. The line is built in e.num and
// written at once: appends are cheaper than the writer's calls.
func (e *encoder) line(name, suffix, le string, v float64, count uint64, isCount bool) {
	b := append(e.num[:0], name...)
	b = append(b, suffix...)
	if len(e.lbl) > 0 || le != "" {
		b = append(b, '{')
		b = append(b, e.lbl...)
		if le != "" {
			if len(e.lbl) > 0 {
				b = append(b, ',')
			}
			b = append(b, `le="`...)
			b = append(b, le...)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	switch {
	case isCount && e.om:
		b = strconv.AppendUint(b, count, 10)
	case isCount:
		b = e.appendFloat(b, float64(count))
	default:
		b = e.appendFloat(b, v)
	}
	b = append(b, '\n')
	e.w.Write(b)
	e.num = b
}

// appendFloat appends f as expfmt's writeFloat, or
// writeOpenMetricsFloat, writes it.
func (e *encoder) appendFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, 1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	}
	if f == 0 {
		f = 0 // no -0: expfmt writes 0
	}
	if f > -1e6 && f < 1e6 && f == math.Trunc(f) {
		// Most values are counts: 'g' writes an integer under 1e6 as
		// its digits (1e6 as 1e+06), and AppendInt is 3 times as fast.
		b = strconv.AppendInt(b, int64(f), 10)
		if e.om {
			b = append(b, '.', '0')
		}
		return b
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, 'g', -1, 64)
	if e.om && !bytes.ContainsAny(b[start:], "e.") {
		b = append(b, '.', '0')
	}
	return b
}

// needsEscape reports whether v holds a character quotedEscaper
// replaces: a byte loop, faster than strings.ContainsAny on short values.
func needsEscape(v string) bool {
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '\\', '\n', '"':
			return true
		}
	}
	return false
}

var (
	helpEscaper   = strings.NewReplacer("\\", `\\`, "\n", `\n`)
	quotedEscaper = strings.NewReplacer("\\", `\\`, "\n", `\n`, "\"", `\"`)
)
