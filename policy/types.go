package policy

import (
	"errors"
	"strconv"
)

// Reasons lists every reason a decision carries, retry reasons first.
func Reasons() []string { return append([]string(nil), decisionReasonNames...) }

func enumName(names []string, i int, what string) string {
	if i >= 0 && i < len(names) && names[i] != "" {
		return names[i]
	}
	return what + "(" + itoa(i) + ")"
}

func parseEnum(names []string, b []byte, what string, dst *uint8) error {
	for i, n := range names {
		if n != "" && n == string(b) {
			*dst = uint8(i)
			return nil
		}
	}
	return errors.New("unknown " + what + " " + strconv.Quote(string(b)))
}
