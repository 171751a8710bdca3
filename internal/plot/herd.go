package plot

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/backstop-dev/backstop/internal/simulate"
)

var (
	failedColor = color.NRGBA{R: 0xd6, G: 0x4f, B: 0x3f, A: 0xff}
	okColor     = color.NRGBA{R: 0x3b, G: 0x8e, B: 0x4f, A: 0xff}
)

// Herd writes a chart of a herd simulation (format "svg" or "png"): the
// calls the dependency received per bucket of bucketMs, served and
// failed, with its recovery marked; below, how many clients had their
// answer, and how many the policy had stopped, over time.
func Herd(w io.Writer, format string, r *simulate.HerdResult, bucketMs int64) error {
	name := r.Policy
	if name == "" {
		name = "policy"
	}
	buckets := r.Buckets(bucketMs)
	if len(buckets) > 1 {
		bucketMs = buckets[1].StartMs // Buckets widens a width that gives more than simulate.MaxBuckets
	}
	calls := newPlot(fmt.Sprintf("%d clients, %s: calls to the dependency per %s (down %s, then %d calls/s)",
		r.Clients, name, dur(bucketMs), dur(r.RecoveryMs), r.CapacityPerSec), "time since the failure", "calls")
	calls.X.Tick.Marker, calls.Y.Tick.Marker = durationTicks{}, integerTicks{}
	var all, served []plotter.HistogramBin
	var peak float64
	for _, b := range buckets {
		lo := seconds(b.StartMs)
		hi := lo + seconds(bucketMs)
		all = append(all, plotter.HistogramBin{Min: lo, Max: hi, Weight: float64(b.Calls)})
		served = append(served, plotter.HistogramBin{Min: lo, Max: hi, Weight: float64(b.OK)})
		peak = max(peak, float64(b.Calls))
	}
	// Served calls are drawn over all calls: what shows of the red is what
	// failed.
	failed := &plotter.Histogram{Bins: all, FillColor: failedColor}
	ok := &plotter.Histogram{Bins: served, FillColor: okColor}
	calls.Add(failed, ok)
	calls.Legend.Add("failed (down or shed)", failed)
	calls.Legend.Add("served", ok)
	calls.Legend.Left = false
	if err := vline(calls, 0, seconds(r.RecoveryMs), peak, "recovered", color.Black); err != nil {
		return err
	}
	calls.Y.Max = peak * 1.15 // headroom for the legend

	done := newPlot("", "time since the failure", "clients done")
	done.X.Tick.Marker, done.Y.Tick.Marker = durationTicks{}, integerTicks{}
	for _, c := range []struct {
		times []int64
		color color.Color
		what  string
	}{{r.CompletionMs, okColor, "succeeded"}, {r.GaveUpMs, failedColor, "gave up"}} {
		pts := plotter.XYs{{X: 0, Y: 0}}
		for i, t := range c.times {
			pts = append(pts, plotter.XY{X: seconds(t), Y: float64(i + 1)})
		}
		pts = append(pts, plotter.XY{X: seconds(r.EndMs), Y: float64(len(c.times))})
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.StepStyle, line.Color, line.Width = plotter.PostStep, c.color, vg.Points(1.5)
		done.Add(line)
		done.Legend.Add(fmt.Sprintf("%s: %d of %d", c.what, len(c.times), r.Clients), line)
	}
	done.Y.Max = float64(r.Clients)
	return render(w, format, 9*vg.Inch, 6*vg.Inch, calls, done)
}
