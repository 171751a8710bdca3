package vector

import "testing"

func TestScanLine(t *testing.T) {
	for _, c := range []struct {
		line    string
		depth   int
		longNum bool
	}{
		{`{"a":[[1]]}`, 3, false},
		{`{"a":"[[[[\"]]]"}`, 1, false},
		{`{"a":"[[[`, 1, false}, // an unterminated string runs to the end
		{`{"a":"x\`, 1, false},  // so does one ending in '\'
		{`]]]{`, 0, false},      // closers first lower the level
		{`{"a":` + "1234567890123456789012345678901234" + `}`, 1, true},
		{`{"a":"1234567890123456789012345678901234"}`, 1, false},
	} {
		if d, l := scanLine([]byte(c.line)); d != c.depth || l != c.longNum {
			t.Errorf("%s: depth %d, long %v; want %d, %v", c.line, d, l, c.depth, c.longNum)
		}
	}
}
