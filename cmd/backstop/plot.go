package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/backstop-dev/backstop/internal/plot"
	"github.com/backstop-dev/backstop/policy"
)

// Bounds of policy plot's flags: more attempts than a chart can show, more
// draws than the envelope needs, more policies than a chart can tell apart,
// and small enough to draw in a moment.
const (
	maxPlotAttempts = 1000
	maxDraws        = 10_000
	maxPlotPolicies = 20
)

// policyPlot draws a policy's schedule, its jitter envelope and knees,
// alone or next to others, as SVG or PNG.
func policyPlot(args []string, stdout io.Writer) error {
	fs := newFlagSet("policy plot")
	out := fs.String("out", "", "chart to write: FILE.svg or FILE.png (required)")
	compare := fs.String("compare", "", "more policies on the same chart: FILE|PRESET,...")
	attempts := fs.Int("attempts", 0, fmt.Sprintf("at most this many failed attempts, up to %d (default: the policy's retries, at most 30)", maxPlotAttempts))
	draws := fs.Int("draws", 1000, fmt.Sprintf("random draws per attempt for the jitter envelope (1..%d)", maxDraws))
	pos, err := parseFlags(fs, args, "FILE|PRESET")
	if err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("%w: --out is required: the chart to write, FILE.svg or FILE.png", errUsage)
	}
	// The envelope holds a row per attempt and three numbers per draw, and
	// costs attempts × draws decisions: bound both.
	if *attempts < 0 || *attempts > maxPlotAttempts {
		return fmt.Errorf("--attempts: must be in 0..%d (got %d)", maxPlotAttempts, *attempts)
	}
	if *draws < 1 || *draws > maxDraws {
		return fmt.Errorf("--draws: must be in 1..%d (got %d)", maxDraws, *draws)
	}
	if *attempts == 0 {
		*attempts = 30
	}
	args = append(pos, splitList(*compare)...)
	if len(args) > maxPlotPolicies {
		return fmt.Errorf("--compare: at most %d policies on a chart (got %d)", maxPlotPolicies-1, len(args)-1)
	}
	envs := make([]plot.Envelope, 0, len(args))
	for _, arg := range args {
		p, name, _, err := loadPolicy(arg)
		if err != nil {
			return err
		}
		envs = append(envs, plot.NewEnvelope(p, name, *attempts, *draws, 1))
	}
	if err := writeChart(*out, func(w io.Writer, format string) error {
		return plot.Schedule(w, format, envs...)
	}); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "wrote", *out)
	return nil
}

// checkChartPath fails early, before a simulation runs, when --out names
// a format we cannot write.
func checkChartPath(path string) error {
	if path == "" {
		return nil
	}
	_, err := plot.FormatOf(path)
	return err
}

// loadPolicy loads a FILE|PRESET argument, returning its source too (the
// simulations build their own instances from it), and names it for a
// chart or a table: the policy's own name, else the file's base name.
func loadPolicy(arg string) (p *policy.Policy, name string, src []byte, err error) {
	src, what, err := readPolicy(arg)
	if err != nil {
		return nil, "", nil, err
	}
	if p, err = policy.Load(src); err != nil {
		return nil, "", nil, problems(what, err)
	}
	if name = p.Name(); name == "" {
		name = strings.TrimSuffix(filepath.Base(arg), filepath.Ext(arg))
	}
	return p, name, src, nil
}

// writeChart creates path and draws into it in the format its extension
// names; a failed draw leaves no half-written file behind.
func writeChart(path string, draw func(w io.Writer, format string) error) error {
	format, err := plot.FormatOf(path)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := errors.Join(draw(f, format), f.Close()); err != nil {
		os.Remove(path)
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// parseInterspersed parses flags that may come after the positional
// arguments ("policy plot default --out x.svg"), which flag.Parse alone
// does not allow, and returns the positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
