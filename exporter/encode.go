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
	ss  *samples
}

// family writes the samples of one metric, sorted by their label values
// as the registry sorts them.
func (e *encoder) family(group []*sample) {
	slices.SortFunc(group, func(a, b *sample) int {
		for i := range a.desc.names {
			if c := cmp.Compare(a.label(i), b.label(i)); c != 0 {
				return c
			}
		}
		return 0
	})
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
		h := e.ss.hist(s)
		if h == nil {
			e.line(s, "", math.NaN(), false, s.value, 0, false)
			continue
		}
		for i, bound := range h.bounds {
			e.line(s, "_bucket", bound, true, 0, h.cum[i], true)
		}
		e.line(s, "_bucket", math.Inf(1), true, 0, h.count, true)
		e.line(s, "_sum", 0, false, h.sum, 0, false)
		e.line(s, "_count", 0, false, 0, h.count, true)
	}
}

// line writes one sample line: the name and suffix, the labels and, with
// le, the le label, then the value: count when isCount, else v.
func (e *encoder) line(s *sample, suffix string, le float64, withLE bool, v float64, count uint64, isCount bool) {
	w := e.w
	w.WriteString(s.desc.name)
	w.WriteString(suffix)
	sep := byte('{')
	for i, n := range s.desc.names {
		w.WriteByte(sep)
		w.WriteString(*n)
		w.WriteString(`="`)
		if v := s.label(i); needsEscape(v) {
			quotedEscaper.WriteString(w, v)
		} else {
			w.WriteString(v) // the common case, without the Replacer's overhead
		}
		w.WriteByte('"')
		sep = ','
	}
	if withLE {
		w.WriteByte(sep)
		w.WriteString(`le="`)
		e.float(le)
		w.WriteByte('"')
		sep = ','
	}
	if sep == ',' {
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	switch {
	case isCount && e.om:
		e.num = strconv.AppendUint(e.num[:0], count, 10)
		w.Write(e.num)
	case isCount:
		e.float(float64(count))
	default:
		e.float(v)
	}
	w.WriteByte('\n')
}

// float writes f as expfmt's writeFloat, or writeOpenMetricsFloat, does.
func (e *encoder) float(f float64) {
	w := e.w
	switch {
	case math.IsNaN(f):
		w.WriteString("NaN")
	case math.IsInf(f, 1):
		w.WriteString("+Inf")
	case math.IsInf(f, -1):
		w.WriteString("-Inf")
	default:
		if f == 0 {
			f = 0 // no -0: expfmt writes 0
		}
		if f > -1e6 && f < 1e6 && f == math.Trunc(f) {
			// Most values are counts: 'g' writes an integer under 1e6 as
			// its digits (1e6 as 1e+06), and AppendInt is 3 times as fast.
			e.num = strconv.AppendInt(e.num[:0], int64(f), 10)
			if e.om {
				e.num = append(e.num, '.', '0')
			}
			w.Write(e.num)
			return
		}
		e.num = strconv.AppendFloat(e.num[:0], f, 'g', -1, 64)
		if e.om && !bytes.ContainsAny(e.num, "e.") {
			e.num = append(e.num, '.', '0')
		}
		w.Write(e.num)
	}
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
