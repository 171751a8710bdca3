package idempotency

import (
	"log/slog"
	"strings"
	"sync"
)

// SafeHeader returns value as every adapter stores and replays it, and
// whether a header called name may be stored at all. It is the one rule the
// Go, Node.js and Python stores apply when they store a response and again
// when they replay one (records stored before the rule), so that no
// language's HTTP server refuses a header another language stored:
//
//   - a name that is not an RFC 9110 token (letters, digits and
//     !#$%&'*+-.^_`|~) is not stored: ok is false;
//   - leading and trailing spaces and tabs are trimmed from value; then each
//     byte of it outside 0x21–0x7E is written %XX (uppercase hex), except a
//     single space or tab between two other bytes. "/orders/€42" becomes
//     "/orders/%E2%82%AC42", CR and LF become %0D and %0A. A value of visible
//     ASCII is unchanged ("%" itself is not escaped), so the rule applied
//     twice gives the same value.
func SafeHeader(name, value string) (safe string, ok bool) {
	if !isToken(name) {
		return "", false
	}
	v := strings.Trim(value, " \t")
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= 0x21 && c <= 0x7e:
			b.WriteByte(c)
		case (c == ' ' || c == '\t') && !isBlank(v[i-1]) && !isBlank(v[i+1]): // trimmed: never at either end
			b.WriteByte(c)
		default:
			const hex = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String(), true
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// safeHeaders applies SafeHeader to every header of h; the name of each
// header it drops is given to dropped.
func safeHeaders(h map[string][]string, dropped func(name string)) map[string][]string {
	out := make(map[string][]string, len(h))
	for name, vs := range h {
		if _, ok := SafeHeader(name, ""); !ok {
			if dropped != nil {
				dropped(name)
			}
			continue
		}
		safe := make([]string, len(vs))
		for i, v := range vs {
			safe[i], _ = SafeHeader(name, v)
		}
		out[name] = safe
	}
	return out
}

// dropped holds the header names already logged as not stored, so that
// each is logged once per process (up to maxDropped names).
var dropped struct {
	sync.Mutex
	names map[string]bool
}

const maxDropped = 1024

// logDropped logs, once per name, that a header was not stored.
func logDropped(log *slog.Logger, name string) {
	dropped.Lock()
	seen := dropped.names[name] || len(dropped.names) >= maxDropped
	if !seen {
		if dropped.names == nil {
			dropped.names = map[string]bool{}
		}
		dropped.names[name] = true
	}
	dropped.Unlock()
	if !seen {
		log.Warn("idempotency: response header not stored: its name is not an HTTP token", "name", name)
	}
}

// SafeHeaders applies SafeHeader to every header of h, for Backend
// implementations: a header whose name is not a token is dropped, logged
// once per name on log when log is not nil (storing), silently when it is
// (reading a record stored before the rule).
func SafeHeaders(h map[string][]string, log *slog.Logger) map[string][]string {
	if log == nil {
		return safeHeaders(h, nil)
	}
	return safeHeaders(h, func(name string) { logDropped(log, name) })
}
