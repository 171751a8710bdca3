package policy

// parseDuration and durationString are time.ParseDuration and
// time.Duration.String (Go 1.26, time/format.go and time/time.go), copied
// so that backstop.wasm does not link package time: its initialisation
// brings in syscall and internal/godebug, about 280 KB of the module for
// two functions. TestDurationMatchesTime and FuzzDuration hold them to
// the originals.

// parseDuration returns the nanoseconds a Go duration ("1h30m", "-1.5s",
// "250ms") denotes; ok is false whenever time.ParseDuration returns an
// error.
func parseDuration(s string) (ns int64, ok bool) {
	// [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+
	var d uint64
	neg := false
	if s != "" {
		if c := s[0]; c == '-' || c == '+' {
			neg = c == '-'
			s = s[1:]
		}
	}
	if s == "0" {
		return 0, true
	}
	if s == "" {
		return 0, false
	}
	for s != "" {
		var (
			v, f  uint64      // integers before, after decimal point
			scale float64 = 1 // value = v + f/scale
		)
		if !(s[0] == '.' || '0' <= s[0] && s[0] <= '9') {
			return 0, false
		}
		pl := len(s)
		var good bool
		if v, s, good = leadingInt(s); !good {
			return 0, false
		}
		pre := pl != len(s)
		post := false
		if s != "" && s[0] == '.' {
			s = s[1:]
			pl := len(s)
			f, scale, s = leadingFraction(s)
			post = pl != len(s)
		}
		if !pre && !post {
			return 0, false
		}
		i := 0
		for ; i < len(s); i++ {
			if c := s[i]; c == '.' || '0' <= c && c <= '9' {
				break
			}
		}
		if i == 0 {
			return 0, false
		}
		unit := durationUnit(s[:i])
		s = s[i:]
		if unit == 0 || v > 1<<63/unit {
			return 0, false
		}
		v *= unit
		if f > 0 {
			// float64 is needed to be nanosecond accurate for fractions of hours.
			v += uint64(float64(f) * (float64(unit) / scale))
			if v > 1<<63 {
				return 0, false
			}
		}
		d += v
		if d > 1<<63 {
			return 0, false
		}
	}
	if neg {
		return -int64(d), true
	}
	if d > 1<<63-1 {
		return 0, false
	}
	return int64(d), true
}

// durationUnit returns the nanoseconds in a unit, 0 for an unknown one (a
// switch, not time's map, which the module would build at start-up).
func durationUnit(u string) uint64 {
	switch u {
	case "ns":
		return 1
	case "us", "µs", "μs": // U+00B5 micro sign, U+03BC Greek mu
		return 1e3
	case "ms":
		return 1e6
	case "s":
		return 1e9
	case "m":
		return 60e9
	case "h":
		return 3600e9
	}
	return 0
}

// leadingInt consumes the leading [0-9]* from s.
func leadingInt(s string) (x uint64, rem string, ok bool) {
	i := 0
	for ; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			break
		}
		if x > 1<<63/10 {
			return 0, rem, false
		}
		x = x*10 + uint64(c) - '0'
		if x > 1<<63 {
			return 0, rem, false
		}
	}
	return x, s[i:], true
}

// leadingFraction consumes the leading [0-9]* from s; past what a uint64
// holds it stops accumulating precision.
func leadingFraction(s string) (x uint64, scale float64, rem string) {
	i := 0
	scale = 1
	overflow := false
	for ; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			break
		}
		if overflow {
			continue
		}
		if x > (1<<63-1)/10 {
			overflow = true
			continue
		}
		y := x*10 + uint64(c) - '0'
		if y > 1<<63 {
			overflow = true
			continue
		}
		x = y
		scale *= 10
	}
	return x, scale, s[i:]
}

// durationString formats nanoseconds as time.Duration.String does
// ("72h3m0.5s", "1.2ms", "0s").
func durationString(d int64) string {
	var buf [32]byte
	w := len(buf)
	u := uint64(d)
	neg := d < 0
	if neg {
		u = -u
	}
	if u < 1e9 {
		var prec int
		w--
		buf[w] = 's'
		w--
		switch {
		case u == 0:
			buf[w] = '0'
			return string(buf[w:])
		case u < 1e3:
			prec = 0
			buf[w] = 'n'
		case u < 1e6:
			prec = 3
			w-- // 'µ' is two bytes
			copy(buf[w:], "µ")
		default:
			prec = 6
			buf[w] = 'm'
		}
		w, u = fmtFrac(buf[:w], u, prec)
		w = fmtInt(buf[:w], u)
	} else {
		w--
		buf[w] = 's'
		w, u = fmtFrac(buf[:w], u, 9)
		w = fmtInt(buf[:w], u%60)
		u /= 60
		if u > 0 {
			w--
			buf[w] = 'm'
			w = fmtInt(buf[:w], u%60)
			u /= 60
			if u > 0 {
				w--
				buf[w] = 'h'
				w = fmtInt(buf[:w], u)
			}
		}
	}
	if neg {
		w--
		buf[w] = '-'
	}
	return string(buf[w:])
}

// fmtFrac formats the fraction of v/10**prec (".12345") into the tail of
// buf, omitting trailing zeros, and the point when the fraction is 0.
func fmtFrac(buf []byte, v uint64, prec int) (nw int, nv uint64) {
	w := len(buf)
	print := false
	for i := 0; i < prec; i++ {
		digit := v % 10
		print = print || digit != 0
		if print {
			w--
			buf[w] = byte(digit) + '0'
		}
		v /= 10
	}
	if print {
		w--
		buf[w] = '.'
	}
	return w, v
}

// fmtInt formats v into the tail of buf.
func fmtInt(buf []byte, v uint64) int {
	w := len(buf)
	if v == 0 {
		w--
		buf[w] = '0'
	} else {
		for v > 0 {
			w--
			buf[w] = byte(v%10) + '0'
			v /= 10
		}
	}
	return w
}
