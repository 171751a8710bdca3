package policy

// maxHintMs bounds a believable server hint: a Retry-After or pushback of
// more than a year (9999999999 seconds, say) is treated as malformed, and the
// computed delay is used instead of stalling a worker for centuries.
const maxHintMs = 365 * 24 * 3600 * 1000

// parseRetryAfter parses an HTTP Retry-After value, delta-seconds or an
// HTTP-date (IMF-fixdate, RFC 850 or asctime, as RFC 9110 requires), and
// returns the wait in milliseconds from nowMs. A date in the past means no
// wait. ok is false for a malformed value, a negative one, a value over
// maxHintMs, or an HTTP-date when nowMs is 0 (unknown). It does not
// allocate.
func parseRetryAfter(v string, nowMs int64) (ms int64, ok bool) {
	v = trimOWS(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		secs, ok := parseUint(v, maxHintMs/1000)
		return secs * 1000, ok
	}
	if nowMs <= 0 {
		return 0, false
	}
	at, ok := parseHTTPDate(v, nowMs)
	if !ok {
		return 0, false
	}
	wait := at - nowMs
	if wait < 0 {
		return 0, true
	}
	if wait > maxHintMs {
		return 0, false
	}
	return wait, true
}

// parsePushback parses a gRPC grpc-retry-pushback-ms value: a
// non-negative integer of milliseconds. ok is false for anything else
// (which declines reports: gRFC A6 reads it as "do not retry").
func parsePushback(v string) (ms int64, ok bool) {
	v = trimOWS(v)
	if !isDigits(v) {
		return 0, false
	}
	return parseUint(v, maxHintMs)
}

// declines reports whether a grpc-retry-pushback-ms value asks the client
// not to retry: gRFC A6 reads a negative or unparseable value so. A
// well-formed value too large to believe (over a year) is not a refusal:
// it falls back to the computed delay as an absurd Retry-After does.
func declines(v string) bool {
	return !isDigits(trimOWS(v))
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseUint parses decimal digits, failing once the value passes limit.
func parseUint(s string, limit int64) (int64, bool) {
	var n int64
	for i := 0; i < len(s); i++ {
		n = n*10 + int64(s[i]-'0')
		if n > limit {
			return 0, false
		}
	}
	return n, true
}

var (
	shortDays = [...]string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
	longDays  = [...]string{"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}
	months    = [...]string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}
)

// parseHTTPDate parses the three HTTP-date forms into Unix milliseconds:
//
//	Sun, 06 Nov 1994 08:49:37 GMT   (IMF-fixdate)
//	Sunday, 06-Nov-94 08:49:37 GMT  (RFC 850)
//	Sun Nov  6 08:49:37 1994        (asctime)
//
// An RFC 850 two-digit year is read as RFC 9110 says: in now's century,
// moved by a century to lie within 50 years of now (past years win ties).
func parseHTTPDate(s string, nowMs int64) (int64, bool) {
	var year, month, day, hh, mm, ss int64
	var ok bool
	switch {
	case len(s) == 29 && s[3] == ',': // IMF-fixdate
		if !oneOf(s[:3], shortDays[:]) || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' || s[25:] != " GMT" {
			return 0, false
		}
		day, ok = num(s[5:7])
		month = monthNum(s[8:11])
		year2, ok2 := num(s[12:16])
		year = year2
		ok = ok && ok2
		hh, mm, ss, ok2 = clock(s[17:25])
		ok = ok && ok2
	case len(s) == 24 && s[3] == ' ': // asctime
		if !oneOf(s[:3], shortDays[:]) || s[7] != ' ' || s[10] != ' ' || s[19] != ' ' {
			return 0, false
		}
		month = monthNum(s[4:7])
		d := s[8:10]
		if d[0] == ' ' {
			d = d[1:]
		}
		day, ok = num(d)
		var ok2 bool
		hh, mm, ss, ok2 = clock(s[11:19])
		ok = ok && ok2
		year, ok2 = num(s[20:24])
		ok = ok && ok2
	default: // RFC 850
		comma := -1
		for i := 0; i < len(s) && i < 10; i++ {
			if s[i] == ',' {
				comma = i
				break
			}
		}
		if comma < 0 || !oneOf(s[:comma], longDays[:]) {
			return 0, false
		}
		r := s[comma:]
		if len(r) != 24 || r[1] != ' ' || r[4] != '-' || r[8] != '-' || r[11] != ' ' || r[20:] != " GMT" {
			return 0, false
		}
		day, ok = num(r[2:4])
		month = monthNum(r[5:8])
		var ok2 bool
		year, ok2 = num(r[9:11])
		ok = ok && ok2
		nowYear := yearOfDays(nowMs / 86_400_000)
		year += nowYear - nowYear%100
		switch {
		case year > nowYear+50:
			year -= 100
		case year <= nowYear-50:
			year += 100
		}
		hh, mm, ss, ok2 = clock(r[12:20])
		ok = ok && ok2
	}
	if !ok || month == 0 || day < 1 || day > daysIn(year, month) || hh > 23 || mm > 59 || ss > 60 {
		return 0, false
	}
	days := daysFromCivil(year, month, day)
	return ((days*24+hh)*60+mm)*60000 + ss*1000, true
}

func oneOf(s string, set []string) bool {
	for _, x := range set {
		if s == x {
			return true
		}
	}
	return false
}

func monthNum(s string) int64 {
	for i, m := range months {
		if s == m {
			return int64(i + 1)
		}
	}
	return 0
}

func num(s string) (int64, bool) {
	if !isDigits(s) {
		return 0, false
	}
	return parseUint(s, 9999)
}

func clock(s string) (hh, mm, ss int64, ok bool) {
	if len(s) != 8 || s[2] != ':' || s[5] != ':' {
		return 0, 0, 0, false
	}
	h, ok1 := num(s[0:2])
	m, ok2 := num(s[3:5])
	c, ok3 := num(s[6:8])
	return h, m, c, ok1 && ok2 && ok3
}

func daysIn(year, month int64) int64 {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// daysFromCivil returns the days since 1970-01-01 of a proleptic Gregorian
// date (Howard Hinnant's algorithm, integer only).
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := y / 400
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// yearOfDays returns the proleptic Gregorian year of a day count since
// 1970-01-01 (the inverse of daysFromCivil, year part only).
func yearOfDays(z int64) int64 {
	z += 719468
	era := z / 146097
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	y := yoe + era*400
	if mp >= 10 { // January or February belong to the next civil year
		y++
	}
	return y
}
