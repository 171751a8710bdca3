package casetest

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
)

var nowToken = regexp.MustCompile(`\{now([+-][0-9]+)?\}`)

// Resolve writes each "{now}", "{now+N}" or "{now-N}" token of s as
// base+N (milliseconds) and records N in known, the offsets Normalise
// tries.
func Resolve(s string, base int64, known map[int64]bool) string {
	return nowToken.ReplaceAllStringFunc(s, func(tok string) string {
		var off int64
		if m := nowToken.FindStringSubmatch(tok); m[1] != "" {
			off, _ = strconv.ParseInt(m[1], 10, 64)
		}
		known[off] = true
		return strconv.FormatInt(base+off, 10)
	})
}

var msNumber = regexp.MustCompile(`\b[0-9]{13}\b`)

// Normalise makes s independent of when the case ran: each 13-digit number
// v (a time in milliseconds) becomes "{now+d}" ("{now}", "{now-d}") for the
// smallest known offset d with base <= v-d <= end; other numbers stay.
func Normalise(s string, base, end int64, known map[int64]bool) string {
	offs := make([]int64, 0, len(known))
	for d := range known {
		offs = append(offs, d)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	return msNumber.ReplaceAllStringFunc(s, func(num string) string {
		v, _ := strconv.ParseInt(num, 10, 64)
		for _, d := range offs {
			if base <= v-d && v-d <= end {
				switch {
				case d == 0:
					return "{now}"
				case d > 0:
					return "{now+" + strconv.FormatInt(d, 10) + "}"
				default:
					return "{now" + strconv.FormatInt(d, 10) + "}"
				}
			}
		}
		return num
	})
}

// DeadlineToken stands in the cases for the text of a worker's deadline
// error, which is each language's own ("deadline": true events).
const DeadlineToken = "{deadline_error}"

// Deadline writes each occurrence of text (the deadline error's, as the
// worker wrote it) in s as DeadlineToken; an empty text changes nothing.
func Deadline(s, text string) string {
	if text == "" {
		return s
	}
	return strings.ReplaceAll(s, text, DeadlineToken)
}
