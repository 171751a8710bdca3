package plot

import (
	"bytes"
	"math"
	"strings"
	"testing"

	gplot "gonum.org/v1/plot"
)

// checkTicks fails t unless ticks are 1..max ticks, increasing, within
// [lo, hi], each labelled with a duration that is not negative.
func checkTicks(t *testing.T, what string, lo, hi float64, most int, ticks []gplot.Tick) {
	t.Helper()
	if len(ticks) == 0 || len(ticks) > most {
		t.Fatalf("%s(%g, %g): %d ticks", what, lo, hi, len(ticks))
	}
	for i, tk := range ticks {
		if tk.Value < lo || tk.Value > hi || (i > 0 && tk.Value <= ticks[i-1].Value) {
			t.Fatalf("%s(%g, %g): tick %d at %g", what, lo, hi, i, tk.Value)
		}
		if tk.Label == "" || strings.HasPrefix(tk.Label, "-") {
			t.Fatalf("%s(%g, %g): tick at %g labelled %q", what, lo, hi, tk.Value, tk.Label)
		}
	}
}

// An axis past time.Duration's 292 years (a policy with a huge cap) gets a
// few ticks with positive labels. Converting to time.Duration made labels
// wrap negative, and a span past the range gave a step of 1ms, and ticks
// without end.
func TestDurationTicksPastTimeDurationRange(t *testing.T) {
	for _, c := range []struct{ lo, hi float64 }{
		{1e10, 1e10 + 60}, // labels past the range, the span within
		{0, 120},
		{0, 4 * 9.2e9}, // the span past it
		{0, math.MaxFloat64},
		{5, 5},
	} {
		checkTicks(t, "durationTicks", c.lo, c.hi, 7, durationTicks{}.Ticks(c.lo, c.hi))
	}
	if got := (durationTicks{}).Ticks(1e10, 1e10+60)[1].Label; got != "2777777h46m50s" {
		t.Errorf("label %q, want 2777777h46m50s", got)
	}
	for _, c := range [][2]float64{{math.NaN(), 1}, {0, math.Inf(1)}, {1, 0}} {
		if ticks := (durationTicks{}).Ticks(c[0], c[1]); len(ticks) != 0 {
			t.Errorf("durationTicks(%g, %g): %v", c[0], c[1], ticks)
		}
	}
}

// The log axis of completion times: labels past 292 years stay positive,
// and a bound of 0 or infinity ends the decades (log10(0) is -Inf, and
// -Inf + 1 is -Inf).
func TestLogDurationTicksBounded(t *testing.T) {
	checkTicks(t, "logDurationTicks", 1, 1e12, 3*13, logDurationTicks{}.Ticks(1, 1e12))
	checkTicks(t, "logDurationTicks", 0, 10, 3*5, logDurationTicks{}.Ticks(0, 10))
	checkTicks(t, "logDurationTicks", 0.5, math.Inf(1), 3*22, logDurationTicks{}.Ticks(0.5, math.Inf(1)))
	if ticks := (logDurationTicks{}).Ticks(math.NaN(), 10); len(ticks) != 0 {
		t.Errorf("logDurationTicks(NaN, 10): %v", ticks)
	}
}

// A schedule whose delays and totals pass time.Duration's range charts
// like any other: the cap is marked, no label is negative.
func TestScheduleChartOfAHugeCap(t *testing.T) {
	p := load(t, "max_attempts: 8\nbackoff: {base: 2562047h, cap: 2562047h}\n")
	env := NewEnvelope(p, "huge", 30, 10, 1)
	for i, s := range env.Steps {
		if s.CumMaxMs < 0 || (i > 0 && s.CumMaxMs <= env.Steps[i-1].CumMaxMs) {
			t.Fatalf("step %+v", s)
		}
	}
	var buf bytes.Buffer
	if err := Schedule(&buf, "svg", env); err != nil {
		t.Fatal(err)
	}
	checkChart(t, "svg", buf.Bytes())
	if svg := buf.String(); strings.Contains(svg, ">-") || !strings.Contains(svg, ">cap 2562047h<") {
		t.Errorf("negative labels or no cap in the chart")
	}
}
