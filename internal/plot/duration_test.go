package plot

import (
	"math"
	"testing"
)

// Duration formats as time.Duration does, and goes on in hours past its
// range instead of wrapping negative.
func TestDurationGoesOnPastTimeDuration(t *testing.T) {
	for _, c := range []struct {
		ms   int64
		want string
	}{
		{0, "0s"},
		{1500, "1.5s"},
		{-5, "-5ms"},
		{9_223_372_036_854, "2562047h47m16.854s"}, // time.Duration's last millisecond
		{9_223_372_036_855, "2562047h47m16.855s"}, // one past it
		{2 * 9_223_369_200_000, "5124094h0m0s"},   // two waits of 2562047h
		{math.MaxInt64, "2562047788015h12m55.807s"},
		{math.MinInt64, "-2562047788015h12m55.808s"},
	} {
		if got := Duration(c.ms); got != c.want {
			t.Errorf("Duration(%d) = %q, want %q", c.ms, got, c.want)
		}
	}
}
