// Package plot draws backstop's charts: a policy's retry schedule with its
// jitter envelope, the herd a simulated outage sends to a dependency, and
// the jitter comparison of the contention experiment. Charts are drawn
// with gonum.org/v1/plot and written as SVG or PNG; Bars draws a small
// schedule chart for a terminal.
package plot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// FormatOf returns the chart format a file name asks for: "svg" or "png".
func FormatOf(path string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg", ".png":
		return ext[1:], nil
	default:
		return "", fmt.Errorf("%s: the chart format comes from the extension: .svg or .png (got %q)", path, ext)
	}
}

// render draws plots stacked in one column, their axes aligned, and
// writes them as SVG or PNG.
func render(w io.Writer, format string, width, height vg.Length, plots ...*gplot.Plot) error {
	var c vg.CanvasWriterTo
	switch format {
	case "svg":
		c = vgsvg.New(width, height)
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96))}
	default:
		return fmt.Errorf("unknown chart format %q: svg or png", format)
	}
	grid := make([][]*gplot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*gplot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(18)}
	canvases := gplot.Align(grid, tiles, draw.New(c))
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	_, err := c.WriteTo(w)
	return err
}

func newPlot(title, x, y string) *gplot.Plot {
	p := gplot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p
}

func seriesColor(i int) color.Color { return plotutil.DarkColors[i%len(plotutil.DarkColors)] }

// translucent returns c at a quarter opacity, for envelopes drawn under
// their median line.
func translucent(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 0x40}
}

var dashed = []vg.Length{vg.Points(4), vg.Points(3)}

// seconds converts milliseconds to the unit the axes use.
func seconds(ms int64) float64 { return float64(ms) / 1000 }

// durationTicks marks an axis in seconds at round durations ("250ms",
// "30s", "2h") rather than at round numbers of seconds ("16m40s").
type durationTicks struct{}

var tickSteps = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// Ticks works in float seconds, never in time.Duration: an axis past about
// 292 years (a policy with a huge cap) would overflow it, and the ticks
// would then never end. There are at most 7.
func (durationTicks) Ticks(lo, hi float64) []gplot.Tick {
	span := hi - lo
	if !(span >= 0) || math.IsInf(span, 0) || math.IsInf(lo, 0) {
		return nil
	}
	step := tickSteps[len(tickSteps)-1].Seconds()
	for _, s := range tickSteps {
		if span/s.Seconds() <= 6 {
			step = s.Seconds()
			break
		}
	}
	for span/step > 6 {
		step *= 2
	}
	var ticks []gplot.Tick
	first := math.Ceil(lo / step)
	for i := 0.0; i < 7; i++ {
		v := (first + i) * step
		if v > hi {
			break
		}
		ticks = append(ticks, gplot.Tick{Value: v, Label: short(Duration(msOf(v)))})
	}
	return ticks
}

// msOf converts seconds to whole milliseconds, saturating.
func msOf(sec float64) int64 {
	switch ms := math.Round(sec * 1000); {
	case math.IsNaN(ms):
		return 0
	case ms >= math.MaxInt64:
		return math.MaxInt64
	case ms <= math.MinInt64:
		return math.MinInt64
	default:
		return int64(ms)
	}
}

// Duration formats a number of milliseconds as time.Duration's String
// does ("1h2m3.5s"), without its limit of about 292 years, past which a
// total of long waits would wrap negative; it goes on in hours.
func Duration(ms int64) string {
	const maxMs = math.MaxInt64 / int64(time.Millisecond)
	if ms >= -maxMs && ms <= maxMs {
		return (time.Duration(ms) * time.Millisecond).String()
	}
	sign, u := "", uint64(ms)
	if ms < 0 {
		sign, u = "-", -u
	}
	rest := int64(u % 3_600_000)
	return fmt.Sprintf("%s%dh%dm%s", sign, u/3_600_000, rest/60_000, time.Duration(rest%60_000)*time.Millisecond)
}

// short formats a duration without its zero tails: "1h", "2m30s".
func short(s string) string {
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// integerTicks marks an axis of counts (attempts, calls) at round whole
// numbers: 1, 2 or 5 × 10^k apart.
type integerTicks struct{}

func (integerTicks) Ticks(lo, hi float64) []gplot.Tick {
	step := 1.0
	for i := 0; (hi-lo)/step > 8; i++ {
		step *= []float64{2, 2.5, 2}[i%3] // 1, 2, 5, 10, 20, 50, ...
	}
	var ticks []gplot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, gplot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ticks
}

// hline is a dashed horizontal marker from x0 to x1, labelled above its
// right end (the left is where legends go).
func hline(p *gplot.Plot, y, x0, x1 float64, label string, c color.Color) error {
	l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return err
	}
	l.Color, l.Dashes = c, dashed
	lb, err := markerLabel(x1, y, label, c)
	if err != nil {
		return err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].XAlign = text.XRight
	}
	lb.Offset.X = -vg.Points(3)
	p.Add(l, lb)
	return nil
}

// vline is a dashed vertical marker from 0 to top, labelled at its top,
// the label of series i one line lower so markers of several series at
// the same place stay readable.
func vline(p *gplot.Plot, i int, x, top float64, label string, c color.Color) error {
	l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: top}})
	if err != nil {
		return err
	}
	l.Color, l.Dashes = c, dashed
	lb, err := markerLabel(x, top, label, c)
	if err != nil {
		return err
	}
	lb.Offset.Y -= vg.Points(11 * float64(i))
	p.Add(l, lb)
	return nil
}

func markerLabel(x, y float64, label string, c color.Color) (*plotter.Labels, error) {
	lb, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: y}}, Labels: []string{label}})
	if err != nil {
		return nil, err
	}
	lb.Offset = vg.Point{X: vg.Points(3), Y: vg.Points(2)}
	for i := range lb.TextStyle {
		lb.TextStyle[i].Color = c
	}
	return lb, nil
}
