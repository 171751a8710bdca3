package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/backstop-dev/backstop/internal/plot"
	"github.com/backstop-dev/backstop/policy"
)

// readPolicy returns the bytes of a policy argument: the contents of a file,
// or a preset name as is (every loader accepts both). It reads at most one
// byte more than policy.MaxFileBytes, enough for the loader to refuse a
// file that is too large, so a huge file or a device never fills memory.
func readPolicy(arg string) (src []byte, name string, err error) {
	if _, ok := policy.PresetText(arg); ok {
		if _, statErr := os.Stat(arg); statErr != nil {
			return []byte(arg), "preset " + arg, nil
		}
	}
	f, err := os.Open(arg)
	if err != nil {
		return nil, "", fmt.Errorf("%w (and %q is not a preset: %s)", err, arg, strings.Join(policy.PresetNames(), ", "))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, policy.MaxFileBytes+1))
	if err != nil {
		return nil, "", err
	}
	return b, arg, nil
}

// problems formats a policy error one problem a line, with file:line.
func problems(name string, err error) error {
	var pe *policy.Error
	if !errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", name, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: invalid policy", name)
	for _, p := range pe.Problems {
		if p.Line > 0 {
			fmt.Fprintf(&b, "\n  %s:%d: %s", name, p.Line, p)
		} else {
			fmt.Fprintf(&b, "\n  %s: %s", name, p)
		}
	}
	if pe.More > 0 {
		fmt.Fprintf(&b, "\n  %s: and %d more", name, pe.More)
	}
	return errors.New(b.String())
}

// maxRows bounds policy check --rows: a table longer than anyone reads,
// and short enough to build in a moment. (With unlimited attempts and full
// jitter the schedule never ends, so --rows is all that stops it.)
const maxRows = 10_000

func policyCheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("policy check")
	rows := fs.Int("rows", 30, fmt.Sprintf("at most this many schedule rows (1..%d)", maxRows))
	chart := fs.Bool("chart", false, "draw the median and max delays as a text chart under the table")
	strict := fs.Bool("strict", false, "exit non-zero when a lint fires (for CI)")
	pos, err := parseFlags(fs, args, "FILE|PRESET")
	if err != nil {
		return err
	}
	if *rows < 1 || *rows > maxRows {
		return fmt.Errorf("--rows: must be in 1..%d (got %d)", maxRows, *rows)
	}
	src, name, err := readPolicy(pos[0])
	if err != nil {
		return err
	}
	p, err := policy.Load(src)
	if err != nil {
		return problems(name, err)
	}
	fmt.Fprintf(stdout, "%s: valid\n%s\n\n", name, p)
	steps := p.Schedule(*rows)
	writeSchedule(stdout, p, steps, *rows)
	if *chart {
		fmt.Fprintln(stdout)
		plot.Bars(stdout, steps, 50)
	}
	lints := p.Lints()
	for _, l := range lints {
		fmt.Fprintf(stderr, "warning: %s\n", l)
	}
	if *strict && len(lints) > 0 {
		return fmt.Errorf("%s: %d %s (--strict): fix the policy, or state why in lint_ignore (docs/policy.md, \"Lints\")", name, len(lints), map[bool]string{true: "lint", false: "lints"}[len(lints) == 1])
	}
	return nil
}

// writeSchedule prints the table people draw by hand in design docs: the
// wait after each failed attempt, low/median/high across the jitter, and
// the cumulative wait.
func writeSchedule(w io.Writer, p *policy.Policy, steps []policy.Step, rows int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "failed attempt\tmin\tmedian\tmax\t\ttotal min\ttotal median\ttotal max\t")
	for _, s := range steps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t\t%s\t%s\t%s\t\n", s.Attempt, dur(s.MinMs), dur(s.MedianMs), dur(s.MaxMs), dur(s.CumMinMs), dur(s.CumMedianMs), dur(s.CumMaxMs))
	}
	tw.Flush()
	last := int64(0)
	if len(steps) > 0 {
		last = steps[len(steps)-1].Attempt
	}
	switch {
	case len(steps) == 0:
		fmt.Fprintln(w, "\nno retries: the first failure is final")
	case p.StopWhen() == "all" && len(steps) < rows:
		fmt.Fprintf(w, "\nattempt %d is the last: its failure comes when every limit has passed (stop_when all)\n", last+1)
	case p.MaxAttempts() > 0 && last == p.MaxAttempts()-1:
		fmt.Fprintf(w, "\nattempt %d is the last: its failure is dead-lettered (max_attempts_reached)\n", p.MaxAttempts())
	case p.MaxElapsedMs() > 0 && len(steps) < rows:
		fmt.Fprintf(w, "\nafter attempt %d even the shortest wait passes max elapsed %s: max_elapsed_exceeded\n", last+1, dur(p.MaxElapsedMs()))
	case rows >= maxRows:
		fmt.Fprintf(w, "\n(first %d rows, the most --rows shows)\n", len(steps))
	default:
		fmt.Fprintf(w, "\n(first %d rows; --rows shows more)\n", len(steps))
	}
}

func dur(ms int64) string { return plot.Duration(ms) }

func policyPresets(stdout io.Writer) error {
	for _, n := range policy.PresetNames() {
		p, _ := policy.Preset(n)
		fmt.Fprintln(stdout, p)
	}
	return nil
}

func policyShow(args []string, stdout io.Writer) error {
	switch {
	case len(args) == 0:
		return fmt.Errorf("%w: missing PRESET", errUsage)
	case len(args) > 1:
		return fmt.Errorf("%w: unexpected argument %q", errUsage, args[1])
	}
	text, ok := policy.PresetText(args[0])
	if !ok {
		return fmt.Errorf("unknown preset %q (presets: %s)", args[0], strings.Join(policy.PresetNames(), ", "))
	}
	_, err := io.WriteString(stdout, text)
	return err
}
