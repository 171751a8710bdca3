package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/internal/simulate"
	"github.com/backstop-dev/backstop/policy"
)

func load(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Load([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkChart fails t unless b is a well-formed SVG document or a PNG
// image, of a sane size.
func checkChart(t *testing.T, format string, b []byte) {
	t.Helper()
	if len(b) < 1000 || len(b) > 4<<20 {
		t.Fatalf("%s chart of %d bytes", format, len(b))
	}
	switch format {
	case "svg":
		d := xml.NewDecoder(bytes.NewReader(b))
		root := ""
		for {
			tok, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("invalid SVG: %v", err)
			}
			if se, ok := tok.(xml.StartElement); ok && root == "" {
				root = se.Name.Local
			}
		}
		if root != "svg" {
			t.Fatalf("root element %q", root)
		}
	case "png":
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("invalid PNG: %v", err)
		}
		if r := img.Bounds(); r.Dx() < 300 || r.Dy() < 300 {
			t.Fatalf("PNG of %v", r)
		}
	}
}

func TestChartsAreValidSVGAndPNG(t *testing.T) {
	envs := []Envelope{
		NewEnvelope(load(t, "critical"), "critical", 30, 200, 1),
		NewEnvelope(load(t, "fast-transient"), "fast-transient", 30, 200, 1),
	}
	herd, err := simulate.Herd([]byte("default"), 300)
	if err != nil {
		t.Fatal(err)
	}
	var series [][]simulate.ContentionResult
	for _, src := range simulate.JitterPolicies() {
		var rs []simulate.ContentionResult
		for _, n := range []int{10, 20} {
			r, err := simulate.Contention(src, n, simulate.WithRuns(3))
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		series = append(series, rs)
	}
	charts := map[string]func(io.Writer, string) error{
		"schedule":   func(w io.Writer, f string) error { return Schedule(w, f, envs...) },
		"herd":       func(w io.Writer, f string) error { return Herd(w, f, herd, 500) },
		"contention": func(w io.Writer, f string) error { return Contention(w, f, series...) },
	}
	for name, draw := range charts {
		for _, format := range []string{"svg", "png"} {
			var b bytes.Buffer
			if err := draw(&b, format); err != nil {
				t.Fatalf("%s %s: %v", name, format, err)
			}
			t.Run(name+"."+format, func(t *testing.T) { checkChart(t, format, b.Bytes()) })
		}
	}
	if err := Schedule(io.Discard, "gif", envs...); err == nil {
		t.Error("gif: no error")
	}
	if err := Schedule(io.Discard, "svg", NewEnvelope(load(t, "max_attempts: 1"), "once", 30, 10, 1)); err == nil {
		t.Error("a policy without retries: no error")
	}
}

func TestFormatOf(t *testing.T) {
	for path, want := range map[string]string{"a.svg": "svg", "b/C.PNG": "png", "c.gif": "", "d": ""} {
		got, err := FormatOf(path)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("FormatOf(%q) = %q, %v", path, got, err)
		}
	}
}

func TestEnvelopeBoundsAndKnees(t *testing.T) {
	// default: full jitter from 1s, 5 attempts: 4 retries, min 0, max the
	// exponential, the median near its half.
	env := NewEnvelope(load(t, "default"), "default", 30, 1000, 1)
	if len(env.Steps) != 4 || env.CapMs != 300_000 || env.MaxDoublings != 16 || env.CapAt != 0 || env.DoublingsAt != 0 {
		t.Fatalf("default: %+v", env)
	}
	for i, s := range env.Steps {
		d := int64(1000) << i
		if s.MinMs != 0 || s.MaxMs != d || s.MedianMs < d*4/10 || s.MedianMs > d*6/10 || s.CumMaxMs != 2*d-1000 {
			t.Errorf("default step %d: %+v", i+1, s)
		}
	}
	// batch: 10s doubling reaches the 1h cap at the 10th failed attempt.
	if env := NewEnvelope(load(t, "batch"), "batch", 30, 100, 1); env.CapAt != 10 || env.DoublingsAt != 0 || len(env.Steps) != 24 {
		t.Errorf("batch: cap at %d, doublings at %d, %d steps", env.CapAt, env.DoublingsAt, len(env.Steps))
	}
	// max_doublings 4 stops the growth at 1.6s, before the 60s cap.
	md := load(t, `{"max_attempts": 12, "backoff": {"base": "100ms", "cap": "60s", "max_doublings": 4}, "jitter": {"mode": "equal"}}`)
	if env := NewEnvelope(md, "md", 30, 100, 1); env.DoublingsAt != 5 || env.CapAt != 0 || env.Steps[4].MaxMs != 1600 || env.Steps[10].MaxMs != 1600 {
		t.Errorf("max doublings: %+v", env)
	}
	// max elapsed ends the schedule where the shortest total wait passes it,
	// as policy.Schedule does.
	p := load(t, `{"max_attempts": 0, "max_elapsed": "10s", "backoff": {"strategy": "constant", "base": "3s", "cap": "3s"}, "jitter": {"mode": "none"}}`)
	if env, sched := NewEnvelope(p, "c", 30, 10, 1), p.Schedule(30); len(env.Steps) != len(sched) || len(sched) != 3 {
		t.Errorf("max elapsed: %d envelope steps, %d schedule rows", len(env.Steps), len(sched))
	}
}

// Decorrelated jitter feeds each delay into the next: the chains must be
// simulated, and the envelope's bounds are the chains that draw 0 and 1.
func TestEnvelopeSimulatesDecorrelatedChains(t *testing.T) {
	p := load(t, `{"max_attempts": 8, "backoff": {"strategy": "decorrelated", "base": "100ms", "cap": "10s"}, "jitter": {"mode": "decorrelated"}}`)
	env := NewEnvelope(p, "d", 30, 500, 1)
	wantMax := []int64{300, 900, 2700, 8100, 10_000, 10_000, 10_000}
	for i, s := range env.Steps {
		if s.MinMs != 100 || s.MaxMs != wantMax[i] || s.MedianMs <= 100 || s.MedianMs >= s.MaxMs {
			t.Errorf("step %d: %+v", i+1, s)
		}
	}
	if env.CapAt != 5 {
		t.Errorf("cap at %d, want 5", env.CapAt)
	}
}

func TestBars(t *testing.T) {
	var b strings.Builder
	Bars(&b, load(t, "default").Schedule(30), 40)
	want := `delay after each failed attempt (█ median, ░ on to the max)
1 │███░░                                    500ms / 1s
2 │█████░░░░░                               1s / 2s
3 │██████████░░░░░░░░░░                     2s / 4s
4 │████████████████████░░░░░░░░░░░░░░░░░░░░ 4s / 8s
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	Bars(&b, nil, 40)
	if b.Len() != 0 {
		t.Errorf("no steps drew %q", b.String())
	}
}
