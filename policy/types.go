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

func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }
func (c Class) MarshalText() ([]byte, error)  { return []byte(c.String()), nil }
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (a *Action) UnmarshalText(b []byte) error {
	return parseEnum(actionNames[:], b, "action", (*uint8)(a))
}
func (c *Class) UnmarshalText(b []byte) error {
	return parseEnum(classNames[:], b, "class", (*uint8)(c))
}
func (r *Reason) UnmarshalText(b []byte) error {
	return parseEnum(reasonNames[:], b, "reason", (*uint8)(r))
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
