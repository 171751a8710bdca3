package plot

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"math/rand/v2"
	"slices"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/backstop-dev/backstop/policy"
)

// Envelope is the spread of one policy's retry delays, failed attempt by
// failed attempt, over many seeded draws of the jitter.
type Envelope struct {
	Name  string
	Draws int
	// Steps are the delays after each failed attempt and the total waited,
	// at their minimum, median and maximum over the draws.
	Steps []policy.Step
	// CapMs is the backoff cap; CapAt the first failed attempt whose
	// longest delay reaches it (0: none within Steps).
	CapMs, CapAt int64
	// MaxDoublings is the exponential strategy's max_doublings; DoublingsAt
	// the first failed attempt at which it stops the growth short of the
	// cap (0: it never does within Steps).
	MaxDoublings, DoublingsAt int64
	// MaxElapsedMs is the policy's elapsed-time limit (0: none).
	MaxElapsedMs int64
}

// NewEnvelope draws the schedule of p for up to attempts failed attempts
// (fewer when max_attempts or max_elapsed ends it first), with draws
// chains of seeded random draws. Each chain feeds its previous delay to
// the next, as a client does, so decorrelated jitter is simulated, not
// approximated. Two of the chains draw 0 and 1 throughout, so the envelope
// shows the exact bounds rather than the luck of the draw.
func NewEnvelope(p *policy.Policy, name string, attempts, draws int, seed uint64) Envelope {
	draws = max(draws, 3) // the two bounds and at least one random chain
	env := Envelope{Name: name, Draws: draws, MaxElapsedMs: p.MaxElapsedMs()}
	env.CapMs, env.MaxDoublings = p.BackoffLimits()
	if p.MaxAttempts() > 0 {
		attempts = min(attempts, int(p.MaxAttempts()-1))
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	prev, cum := make([]int64, draws), make([]int64, draws)
	sorted := make([]int64, draws)
	for a := int64(1); a <= int64(attempts); a++ {
		for k := range prev {
			r := rng.Float64()
			if k < 2 {
				r = float64(k)
			}
			prev[k] = p.Backoff(a, prev[k], r)
			cum[k] = satAdd(cum[k], prev[k])
		}
		s := policy.Step{Attempt: a}
		s.MinMs, s.MedianMs, s.MaxMs = spread(sorted, prev)
		s.CumMinMs, s.CumMedianMs, s.CumMaxMs = spread(sorted, cum)
		// As policy.Schedule: a retry that is due past max elapsed even at
		// the shortest wait is never scheduled.
		if env.MaxElapsedMs > 0 && s.CumMinMs > env.MaxElapsedMs {
			break
		}
		env.Steps = append(env.Steps, s)
		if env.CapAt == 0 && env.CapMs > 0 && s.MaxMs >= env.CapMs {
			env.CapAt = a
		}
	}
	// Past max_doublings the exponential delay stops growing; that is a
	// knee of its own only when it comes before the cap.
	if knee := env.MaxDoublings + 1; env.MaxDoublings > 0 && knee <= int64(len(env.Steps)) &&
		(env.CapAt == 0 || knee < env.CapAt) {
		env.DoublingsAt = knee
	}
	return env
}

func spread(buf, v []int64) (lo, median, hi int64) {
	copy(buf, v)
	slices.Sort(buf)
	return buf[0], buf[len(buf)/2], buf[len(buf)-1]
}

// Schedule writes a chart of one or more policies' schedules (format "svg"
// or "png"): the delay before each retry and the total waited, each as a
// band from the minimum to the maximum with the median drawn through it,
// the cap and max-doublings knees and the max-elapsed limit marked.
func Schedule(w io.Writer, format string, envs ...Envelope) error {
	if !slices.ContainsFunc(envs, func(e Envelope) bool { return len(e.Steps) > 0 }) {
		return errors.New("nothing to plot: the first failure is final (no retries)")
	}
	title := "retry schedule"
	if len(envs) > 1 {
		title = "retry schedules"
	}
	delay := newPlot(title, "failed attempt", "delay before the next attempt")
	total := newPlot("", "failed attempt", "total waited")
	delay.X.Tick.Marker, total.X.Tick.Marker = integerTicks{}, integerTicks{}
	delay.Y.Tick.Marker, total.Y.Tick.Marker = durationTicks{}, durationTicks{}
	var top, topTotal float64
	for _, env := range envs {
		for _, s := range env.Steps {
			top, topTotal = max(top, seconds(s.MaxMs)), max(topTotal, seconds(s.CumMaxMs))
		}
	}
	for i, env := range envs {
		if len(env.Steps) == 0 {
			continue
		}
		c := seriesColor(i)
		band, line, err := envelope(env.Steps, c, func(s policy.Step) (int64, int64, int64) { return s.MinMs, s.MedianMs, s.MaxMs })
		if err != nil {
			return err
		}
		delay.Add(band, line)
		total.Legend.Add(fmt.Sprintf("%s: median, band min–max of %d draws", env.Name, env.Draws), band, line)
		band, line, err = envelope(env.Steps, c, func(s policy.Step) (int64, int64, int64) { return s.CumMinMs, s.CumMedianMs, s.CumMaxMs })
		if err != nil {
			return err
		}
		total.Add(band, line)
		if env.CapAt > 0 {
			if err := vline(delay, i, float64(env.CapAt), top, "cap "+short(Duration(env.CapMs)), c); err != nil {
				return err
			}
		}
		if env.DoublingsAt > 0 {
			if err := vline(delay, i, float64(env.DoublingsAt), top, fmt.Sprintf("max doublings %d", env.MaxDoublings), c); err != nil {
				return err
			}
		}
		if env.MaxElapsedMs > 0 && seconds(env.MaxElapsedMs) <= 1.5*topTotal {
			last := float64(env.Steps[len(env.Steps)-1].Attempt)
			if err := hline(total, seconds(env.MaxElapsedMs), 1, last, "max elapsed "+short(Duration(env.MaxElapsedMs)), c); err != nil {
				return err
			}
		}
	}
	// Headroom above the highest line for the legend, a row per policy.
	total.Y.Max = max(total.Y.Max, topTotal) * (1 + 0.1*float64(len(envs)))
	return render(w, format, 8*vg.Inch, 7*vg.Inch, delay, total)
}

// envelope returns a translucent band from the low to the high value and
// the median line through it.
func envelope(steps []policy.Step, c color.Color, pick func(policy.Step) (lo, mid, hi int64)) (*plotter.Polygon, *plotter.Line, error) {
	ring := make(plotter.XYs, 0, 2*len(steps))
	mid := make(plotter.XYs, len(steps))
	for i, s := range steps {
		_, m, hi := pick(s)
		ring = append(ring, plotter.XY{X: float64(s.Attempt), Y: seconds(hi)})
		mid[i] = plotter.XY{X: float64(s.Attempt), Y: seconds(m)}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		lo, _, _ := pick(steps[i])
		ring = append(ring, plotter.XY{X: float64(steps[i].Attempt), Y: seconds(lo)})
	}
	band, err := plotter.NewPolygon(ring)
	if err != nil {
		return nil, nil, err
	}
	band.Color, band.LineStyle.Width = translucent(c), 0
	line, err := plotter.NewLine(mid)
	if err != nil {
		return nil, nil, err
	}
	line.Color, line.Width = c, vg.Points(1.5)
	return band, line, nil
}

func dur(ms int64) string { return Duration(ms) }

// satAdd returns a+b for non-negative a and b, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
