package plot

import (
	"fmt"
	"io"
	"math"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/backstop-dev/backstop/internal/simulate"
)

// Contention writes the jitter comparison of the contention experiment
// (format "svg" or "png"): work (writes) and completion time against the
// number of clients, a line per policy. series holds one slice of results
// per policy, ordered by clients. Completion time is on a log scale: no
// jitter takes so much longer that on a linear one the jittered policies
// would lie flat on the axis.
func Contention(w io.Writer, format string, series ...[]simulate.ContentionResult) error {
	work := newPlot("contention: total work", "clients", "writes per run (mean)")
	took := newPlot("contention: completion time (log scale)", "clients", "time to finish (mean)")
	var ticks []gplot.Tick
	lo, hi := math.Inf(1), 0.0
	for i, rs := range series {
		if len(rs) == 0 {
			continue
		}
		calls, times := make(plotter.XYs, len(rs)), make(plotter.XYs, len(rs))
		for j, r := range rs {
			calls[j] = plotter.XY{X: float64(r.Clients), Y: r.Calls}
			times[j] = plotter.XY{X: float64(r.Clients), Y: r.CompletionMs / 1000}
			lo, hi = min(lo, times[j].Y), max(hi, times[j].Y)
			if i == 0 {
				ticks = append(ticks, gplot.Tick{Value: float64(r.Clients), Label: fmt.Sprint(r.Clients)})
			}
		}
		for _, panel := range []struct {
			p   *gplot.Plot
			xys plotter.XYs
		}{{work, calls}, {took, times}} {
			line, points, err := plotter.NewLinePoints(panel.xys)
			if err != nil {
				return err
			}
			line.Color, line.Width = seriesColor(i), vg.Points(1.5)
			points.Color, points.Shape = seriesColor(i), draw.CircleGlyph{}
			panel.p.Add(line, points)
			if panel.p == work { // one legend: the colours are the same below
				work.Legend.Add(rs[0].Policy, line, points)
			}
		}
	}
	work.X.Tick.Marker, took.X.Tick.Marker = gplot.ConstantTicks(ticks), gplot.ConstantTicks(ticks)
	work.Y.Tick.Marker = integerTicks{}
	if hi > 0 {
		took.Y.Scale, took.Y.Tick.Marker = gplot.LogScale{}, logDurationTicks{}
		took.Y.Min, took.Y.Max = lo/1.5, hi*1.5
	}
	return render(w, format, 8*vg.Inch, 8*vg.Inch, work, took)
}

// logDurationTicks marks a log axis in seconds at 1, 2 and 5 × 10^k,
// labelled as durations.
type logDurationTicks struct{}

// Ticks runs over the decades from 1ms to 10^18 s at most, so a zero or
// infinite bound cannot make the loop endless.
func (logDurationTicks) Ticks(lo, hi float64) []gplot.Tick {
	var ticks []gplot.Tick
	for k := max(math.Floor(math.Log10(lo)), -3); k <= min(math.Ceil(math.Log10(hi)), 18); k++ {
		for _, m := range []float64{1, 2, 5} {
			if v := m * math.Pow(10, k); v >= lo && v <= hi {
				ticks = append(ticks, gplot.Tick{Value: v, Label: short(Duration(msOf(v)))})
			}
		}
	}
	return ticks
}
