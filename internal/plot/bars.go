package plot

import (
	"fmt"
	"io"
	"strings"

	"github.com/backstop-dev/backstop/policy"
)

// Bars writes a schedule as a text chart for a terminal: a bar per failed
// attempt, solid up to the median delay and shaded on to the maximum,
// scaled so the longest delay takes width columns.
//
//	delay after each failed attempt (█ median, ░ on to the max)
//	 1 │█████████████░░░░░░░░░░░░░░               500ms / 1s
//	 2 │███████████████████████████░░░░░░░░░░░░░░░░ 1s / 2s
func Bars(w io.Writer, steps []policy.Step, width int) {
	if len(steps) == 0 {
		return
	}
	width = max(width, 10)
	var top int64
	for _, s := range steps {
		top = max(top, s.MaxMs)
	}
	cols := func(ms int64) int {
		if ms <= 0 || top == 0 {
			return 0
		}
		return max(1, int((ms*int64(width)+top/2)/top)) // round; a non-zero delay stays visible
	}
	digits := len(fmt.Sprint(steps[len(steps)-1].Attempt))
	fmt.Fprintln(w, "delay after each failed attempt (█ median, ░ on to the max)")
	for _, s := range steps {
		med, hi := cols(s.MedianMs), cols(s.MaxMs)
		fmt.Fprintf(w, "%*d │%s%s%s %s / %s\n", digits, s.Attempt,
			strings.Repeat("█", med), strings.Repeat("░", hi-med), strings.Repeat(" ", width-hi),
			dur(s.MedianMs), dur(s.MaxMs))
	}
}
