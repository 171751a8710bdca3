package policy

import (
	"bytes"
	"math"
	"strconv"
	"strings"

	"github.com/backstop-dev/backstop/internal/grpccode"
)

// Parse reads a policy file, JSON or YAML, and returns a new Policy with
// fresh budget and breaker state. Fields the file leaves out take the values
// of the "default" preset, or of the preset named by its "extends" field.
//
// # Errors
//
// Parse is strict: unknown fields, duplicate keys, wrong types and values out
// of range are all reported, as an *Error whose problems each name the field
// path and the reason, for example
//
//	backoff.cap: must be >= backoff.base (got 100ms < 1s)
//
// So are a second YAML document and inputs past the limits (MaxFileBytes,
// checked before parsing, MaxTableEntries, MaxListItems); at most
// MaxProblems problems are listed.
//
// # Notes
//
// YAML is read the same way natively and in backstop.wasm: JSON and the
// subset of YAML that docs/policy.md describes ("Policy files"). Anchors,
// aliases, tags, block scalars and the rest of YAML are an error naming the
// line and the feature. Merge keys ("<<") of objects written out are
// merged as YAML defines them.
func Parse(data []byte) (*Policy, error) {
	if len(data) > MaxFileBytes {
		return nil, docError("must be at most " + itoa(MaxFileBytes) + " bytes (64 KiB)")
	}
	root, problem := document(data)
	if problem != nil {
		return nil, &Error{Problems: []*FieldError{problem}}
	}
	raw := defaultRaw()
	d := &decoder{lines: map[string]int{}}
	if base, line := extendsOf(root); base != "" {
		d.lines["extends"] = line
		text, ok := presets[base]
		if !ok {
			d.fail("extends", "unknown preset "+strconv.Quote(base)+" (presets: "+strings.Join(PresetNames(), ", ")+")")
		} else {
			raw = mustRaw(text)
		}
	}
	d.policy(root, &raw)
	return d.build(&raw)
}

func docError(reason string) *Error {
	return &Error{Problems: []*FieldError{{Field: "(document)", Reason: reason}}}
}

// document returns the root node of the one YAML document in data (JSON is
// YAML), or the problem: a syntax error, YAML outside the subset, no
// document, or a second document, which a YAML parser would ignore without
// a word. readYAML (yaml_subset.go) is the one reader, native and wasm.
func document(data []byte) (*node, *FieldError) {
	root, problem := readYAML(data)
	if problem != nil {
		return nil, problem
	}
	if line := secondDocument(data); line > 0 {
		return nil, &FieldError{Field: "(document)", Line: line,
			Reason: "must be one YAML document (a second one starts at line " + itoa(line) + ")"}
	}
	if root == nil {
		return nil, &FieldError{Field: "(document)", Reason: "must be a JSON or YAML object"}
	}
	return root, nil
}

// secondDocument returns the line on which a second YAML document starts,
// 0 when there is none: a "---" line after content, or content after a
// "..." line. The parser takes "---" and "..." for markers only at the
// start of a line and followed by a space, a tab or the line's end, and
// nowhere else (not even inside a quoted or block scalar), so neither
// does this.
//
// yaml.NewDecoder would find it too, but it reads from an io.Reader, and
// that one dynamic Read call links (*os.File).Read, and with it the WASI
// import fd_read, into backstop.wasm, which must import nothing the Go
// runtime does not need.
func secondDocument(data []byte) int {
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	content, ended := false, false
	for line := 1; len(data) > 0; line++ {
		var l []byte
		l, data, _ = bytes.Cut(data, []byte("\n"))
		l = bytes.TrimSuffix(l, []byte("\r"))
		switch {
		case isMarker(l, "---"):
			if content || ended {
				return line
			}
			l = l[3:] // "--- {a: 1}": the document may start on the marker's line
		case isMarker(l, "..."):
			ended = true
			continue
		case !content && len(l) > 0 && l[0] == '%':
			continue // a directive (%YAML, %TAG)
		}
		if t := bytes.TrimLeft(l, " \t"); len(t) > 0 && t[0] != '#' {
			if ended {
				return line
			}
			content = true
		}
	}
	return 0
}

func isMarker(line []byte, m string) bool {
	return bytes.HasPrefix(line, []byte(m)) && (len(line) == 3 || line[3] == ' ' || line[3] == '\t')
}

// Preset returns a new Policy built from a named preset: "default",
// "critical", "batch", "cloud-tasks" or "fast-transient" (see PresetNames).
func Preset(name string) (*Policy, error) {
	text, ok := presets[name]
	if !ok {
		return nil, &Error{Problems: []*FieldError{{Field: "preset", Reason: "unknown preset " + strconv.Quote(name) + " (presets: " + strings.Join(PresetNames(), ", ") + ")"}}}
	}
	return Parse([]byte(text))
}

// Load returns a new Policy from a preset name or from policy file contents:
// what every host accepts where a policy is expected.
func Load(presetOrData []byte) (*Policy, error) {
	if _, ok := presets[string(presetOrData)]; ok {
		return Preset(string(presetOrData))
	}
	return Parse(presetOrData)
}

// rawPolicy is a policy file's content before it is built into a Policy.
type rawPolicy struct {
	name                 string
	maxAttempts          int64
	maxElapsedMs         int64
	attemptTimeoutMs     int64
	connectTimeoutMs     int64
	uncertainMaxAttempts int64
	stopWhen             string

	strategy     string
	baseMs       int64
	capMs        int64
	multMilli    int64
	maxDoublings int64
	jitter       string
	ratioPPM     int64

	hintHonor    bool
	hintMode     string
	hintCapMs    int64
	hintOnExceed string

	defaultClass string
	http         []rule
	grpc         []rule
	kinds        []rule

	idempotentMethods []string
	neverSent         []string

	budget  *rawBudget
	circuit *rawCircuit
	onOpen  string

	retriedDownstream string

	lintIgnore map[string]string // lint code → the stated reason
}

type rule struct{ key, class string }

type rawBudget struct {
	kind                string
	maxTokensMilli      int64
	tokenRatioMilli     int64
	ratioPPM            int64
	windowMs            int64
	minRetriesPerSecond int64
}

type rawCircuit struct {
	kind              string // "consecutive" (the default) or "failure_rate"
	failureThreshold  int64
	openForMs         int64
	halfOpenSuccesses int64
	halfOpenMaxCalls  int64

	// failure_rate
	rateThresholdPct int64
	windowByTime     bool
	windowSize       int64           // calls, or seconds
	minimumCalls     int64           // 0: not written (the window's size, at most 100)
	slowRatePct      int64           // slow_call_rate_threshold; 0: no slow-call rate
	slowMs           int64           // slow_call_duration_threshold
	set              map[string]bool // the fields the file wrote, by name
}

func defaultRaw() rawPolicy {
	return rawPolicy{
		maxAttempts: 5, uncertainMaxAttempts: 2, stopWhen: "any", onOpen: OnOpenDefer,
		retriedDownstream: DownstreamGiveUp,
		strategy:          "exponential", baseMs: 1000, capMs: 300_000, multMilli: 2000, maxDoublings: 16,
		jitter:    "full",
		hintHonor: true, hintMode: "max", hintCapMs: 3_600_000, hintOnExceed: "give_up",
		defaultClass:      "uncertain",
		idempotentMethods: []string{"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"},
		neverSent:         []string{"connection_refused", "dns_temporary", "connect_timeout"},
	}
}

func mustRaw(text string) rawPolicy {
	root, problem := readYAML([]byte(text))
	if problem != nil {
		panic(problem)
	}
	raw := defaultRaw()
	d := &decoder{lines: map[string]int{}}
	d.policy(root, &raw)
	if len(d.problems) > 0 {
		panic(d.problems[0])
	}
	return raw
}

type decoder struct {
	problems []*FieldError
	more     int // problems found past MaxProblems
	lines    map[string]int
	line     int
}

func (d *decoder) fail(path, reason string) {
	if len(d.problems) >= MaxProblems {
		d.more++
		return
	}
	line := d.lines[path]
	if line == 0 {
		line = d.line
	}
	d.problems = append(d.problems, &FieldError{Field: path, Line: line, Reason: reason})
}

// entry is one key/value pair of a mapping.
type entry struct {
	key  string
	k, v *node
}

// entries returns the pairs of mapping n in file order, merge keys
// ("<<: {base: 1s}", "<<: [{...}, {...}]") expanded as YAML
// defines them: keys written in n win over merged ones, and an earlier
// merged mapping over a later one. Keys n repeats are all returned (the
// caller reports duplicates). norm, when not nil, says which keys are the
// same one (a gRPC name and its code).
//
// Each mapping is expanded at most once per call, so merges of merges
// cannot multiply the work, and a cycle ends.
func (d *decoder) entries(n *node, path string, norm func(string) string) []entry {
	if norm == nil {
		norm = func(k string) string { return k }
	}
	done := map[*node]bool{}
	var walk func(n *node) (own, merged []entry)
	walk = func(n *node) (own, merged []entry) {
		top := len(done) == 0
		done[n] = true
		seen := map[string]bool{} // a merged mapping's own duplicates (n's are the caller's)
		for i := 0; i+1 < len(n.content); i += 2 {
			k, v := n.content[i], n.content[i+1]
			d.line = k.line
			if k.kind == scalarNode && k.tag == "!!merge" {
				from := []*node{v}
				if v.kind == sequenceNode {
					from = v.content
				}
				for _, m := range from {
					if m.kind != mappingNode {
						d.fail(join(path, "<<"), "must be an object or a list of objects to merge")
						continue
					}
					if !done[m] {
						o, mm := walk(m)
						merged = append(append(merged, o...), mm...)
					}
				}
				continue
			}
			if k.kind != scalarNode {
				d.fail(orRoot(path), "keys must be strings")
				continue
			}
			key := norm(k.value)
			if !top && seen[key] {
				d.lines[join(path, k.value)] = k.line
				d.fail(join(path, k.value), "duplicate key")
				continue
			}
			seen[key] = true
			own = append(own, entry{key: k.value, k: k, v: v})
		}
		return own, merged
	}
	own, merged := walk(n)
	set := map[string]bool{}
	for _, e := range own {
		set[norm(e.key)] = true
	}
	for _, e := range merged {
		if key := norm(e.key); !set[key] {
			set[key] = true
			own = append(own, e)
		}
	}
	return own
}

// fields walks a mapping node, calling the handler of each known key and
// reporting unknown and duplicate keys.
func (d *decoder) fields(n *node, path string, handlers map[string]func(*node, string)) {
	if !d.object(n, path) {
		return
	}
	seen := map[string]bool{}
	for _, e := range d.entries(n, path, nil) {
		k, v := e.k, e.v
		p := join(path, e.key)
		d.lines[p] = k.line
		d.line = k.line
		if seen[e.key] {
			d.fail(p, "duplicate key")
			continue
		}
		seen[e.key] = true
		h, ok := handlers[e.key]
		if !ok {
			d.fail(p, "unknown field")
			continue
		}
		d.line = v.line
		h(v, p)
	}
}

// object reports a node that is not a mapping, or is one with a tag other
// than !!map.
func (d *decoder) object(n *node, path string) bool {
	if n.kind != mappingNode {
		d.line = n.line
		d.fail(orRoot(path), "must be an object")
		return false
	}
	if tag := n.tag; tag != "!!map" {
		d.line = n.line
		d.fail(orRoot(path), "must be an object (got a mapping tagged "+tag+")")
		return false
	}
	return true
}

func orRoot(path string) string {
	if path == "" {
		return "(document)"
	}
	return path
}

func join(path, key string) string {
	if key == "" {
		key = `""`
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// extendsOf returns the preset a policy extends and the line that says
// so, "" when none (or when its value is invalid, which d.policy reports).
func extendsOf(root *node) (string, int) {
	if root.kind != mappingNode {
		return "", 0
	}
	// A scratch decoder: d.policy reports the problems of these entries.
	for _, e := range (&decoder{lines: map[string]int{}}).entries(root, "", nil) {
		if e.key == "extends" {
			if e.v.kind != scalarNode || e.v.tag != "!!str" {
				return "", 0
			}
			return e.v.value, e.k.line
		}
	}
	return "", 0
}

func (d *decoder) policy(n *node, r *rawPolicy) {
	d.fields(n, "", map[string]func(*node, string){
		"name": func(v *node, p string) { d.str(v, p, &r.name) },
		"extends": func(v *node, p string) {
			var s string
			d.str(v, p, &s)
		},
		"max_attempts":    func(v *node, p string) { d.integer(v, p, 0, 1_000_000, &r.maxAttempts) },
		"max_elapsed":     func(v *node, p string) { d.duration(v, p, &r.maxElapsedMs) },
		"attempt_timeout": func(v *node, p string) { d.duration(v, p, &r.attemptTimeoutMs) },
		"connect_timeout": func(v *node, p string) { d.duration(v, p, &r.connectTimeoutMs) },
		"stop_when":       func(v *node, p string) { d.enum(v, p, stopWhenNames, &r.stopWhen) },
		"on_open":         func(v *node, p string) { d.enum(v, p, onOpenNames, &r.onOpen) },
		"retried_downstream": func(v *node, p string) {
			d.enum(v, p, downstreamNames, &r.retriedDownstream)
		},
		"lint_ignore": func(v *node, p string) { d.lintIgnore(v, p, r) },
		"uncertain": func(v *node, p string) {
			d.fields(v, p, map[string]func(*node, string){
				"max_attempts": func(v *node, p string) { d.integer(v, p, 1, 1_000_000, &r.uncertainMaxAttempts) },
			})
		},
		"backoff": func(v *node, p string) {
			d.fields(v, p, map[string]func(*node, string){
				"strategy":      func(v *node, p string) { d.enum(v, p, strategyNames, &r.strategy) },
				"base":          func(v *node, p string) { d.duration(v, p, &r.baseMs) },
				"cap":           func(v *node, p string) { d.duration(v, p, &r.capMs) },
				"multiplier":    func(v *node, p string) { d.fixed(v, p, 3, 1000, 1000_000, &r.multMilli) },
				"max_doublings": func(v *node, p string) { d.integer(v, p, 0, 1000, &r.maxDoublings) },
			})
		},
		"jitter": func(v *node, p string) {
			d.fields(v, p, map[string]func(*node, string){
				"mode":  func(v *node, p string) { d.enum(v, p, jitterNames, &r.jitter) },
				"ratio": func(v *node, p string) { d.fixed(v, p, 6, 0, 1_000_000, &r.ratioPPM) },
			})
		},
		"retry_after": func(v *node, p string) {
			d.fields(v, p, map[string]func(*node, string){
				"honor":     func(v *node, p string) { d.boolean(v, p, &r.hintHonor) },
				"mode":      func(v *node, p string) { d.enum(v, p, hintModeNames, &r.hintMode) },
				"cap":       func(v *node, p string) { d.duration(v, p, &r.hintCapMs) },
				"on_exceed": func(v *node, p string) { d.enum(v, p, onExceedNames, &r.hintOnExceed) },
			})
		},
		"classify": func(v *node, p string) {
			d.fields(v, p, map[string]func(*node, string){
				"default":     func(v *node, p string) { d.enum(v, p, classNames[:], &r.defaultClass) },
				"http":        func(v *node, p string) { r.http = append(r.http, d.rules(v, p, httpKey)...) },
				"grpc":        func(v *node, p string) { r.grpc = append(r.grpc, d.rules(v, p, grpcKey)...) },
				"error_kinds": func(v *node, p string) { r.kinds = append(r.kinds, d.rules(v, p, kindKey)...) },
			})
		},
		"idempotency": func(v *node, p string) {
			d.fields(v, p, map[string]func(*node, string){
				"idempotent_methods": func(v *node, p string) { d.strings(v, p, &r.idempotentMethods) },
				"never_sent_kinds":   func(v *node, p string) { d.strings(v, p, &r.neverSent) },
			})
		},
		"retry_budget": func(v *node, p string) {
			b := &rawBudget{kind: "token_bucket", maxTokensMilli: 100_000, tokenRatioMilli: 100,
				ratioPPM: 200_000, windowMs: 10_000, minRetriesPerSecond: 10}
			r.budget = b
			d.fields(v, p, map[string]func(*node, string){
				"type":                   func(v *node, p string) { d.enum(v, p, []string{"token_bucket", "ratio"}, &b.kind) },
				"max_tokens":             func(v *node, p string) { d.fixed(v, p, 3, 1, 1_000_000, &b.maxTokensMilli) },
				"token_ratio":            func(v *node, p string) { d.fixed(v, p, 3, 1, 1_000_000, &b.tokenRatioMilli) },
				"ratio":                  func(v *node, p string) { d.fixed(v, p, 6, 1, 10_000_000, &b.ratioPPM) },
				"window":                 func(v *node, p string) { d.duration(v, p, &b.windowMs) },
				"min_retries_per_second": func(v *node, p string) { d.integer(v, p, 0, 1_000_000, &b.minRetriesPerSecond) },
			})
		},
		"circuit_breaker": func(v *node, p string) {
			c := &rawCircuit{kind: "consecutive", failureThreshold: 5, openForMs: 30_000, halfOpenSuccesses: 1, halfOpenMaxCalls: 1,
				rateThresholdPct: 50, windowSize: 100, slowMs: -1, set: map[string]bool{}}
			r.circuit = c
			seen := func(name string, f func(*node, string)) func(*node, string) {
				return func(v *node, p string) { c.set[name] = true; f(v, p) }
			}
			d.fields(v, p, map[string]func(*node, string){
				"type":                   func(v *node, p string) { d.enum(v, p, []string{"consecutive", "failure_rate"}, &c.kind) },
				"failure_threshold":      seen("failure_threshold", func(v *node, p string) { d.integer(v, p, 1, 1_000_000, &c.failureThreshold) }),
				"open_for":               func(v *node, p string) { d.duration(v, p, &c.openForMs) },
				"half_open_successes":    func(v *node, p string) { d.integer(v, p, 1, 1_000_000, &c.halfOpenSuccesses) },
				"half_open_max_calls":    func(v *node, p string) { d.integer(v, p, 1, 1_000_000, &c.halfOpenMaxCalls) },
				"failure_rate_threshold": seen("failure_rate_threshold", func(v *node, p string) { d.integer(v, p, 1, 100, &c.rateThresholdPct) }),
				"minimum_calls":          seen("minimum_calls", func(v *node, p string) { d.integer(v, p, 1, 1_000_000, &c.minimumCalls) }),
				"sliding_window":         seen("sliding_window", func(v *node, p string) { d.slidingWindow(v, p, c) }),
				"slow_call_rate_threshold": seen("slow_call_rate_threshold", func(v *node, p string) {
					d.integer(v, p, 1, 100, &c.slowRatePct)
				}),
				"slow_call_duration_threshold": seen("slow_call_duration_threshold", func(v *node, p string) {
					d.duration(v, p, &c.slowMs)
				}),
			})
		},
	})
}

func (d *decoder) scalar(v *node, p, want string) bool {
	if v.kind != scalarNode || v.tag == "!!null" {
		d.fail(p, "must be "+want)
		return false
	}
	return true
}

// tagged returns the tag a file wrote on a node ("!!str "), "" when none:
// a value whose explicit tag makes it the wrong type says so in its error.
func tagged(v *node) string {
	if v.tagged {
		return v.tag + " "
	}
	return ""
}

func (d *decoder) str(v *node, p string, dst *string) {
	if d.scalar(v, p, "a string") {
		// A plain << is YAML's merge key only as a key; as a value it is text.
		if tag := v.tag; tag != "!!str" && !(tag == "!!merge" && tagged(v) == "") {
			d.fail(p, "must be a string (got "+tagged(v)+v.value+")")
			return
		}
		*dst = v.value
	}
}

func (d *decoder) enum(v *node, p string, names []string, dst *string) {
	want := "one of " + strings.Join(names, ", ")
	if !d.scalar(v, p, want) {
		return
	}
	for _, n := range names {
		if v.value == n {
			*dst = n
			return
		}
	}
	d.fail(p, "must be "+want+" (got "+tagged(v)+strconv.Quote(v.value)+")")
}

func (d *decoder) boolean(v *node, p string, dst *bool) {
	if d.scalar(v, p, "true or false") {
		if v.tag != "!!bool" {
			d.fail(p, "must be true or false (got "+tagged(v)+strconv.Quote(v.value)+")")
			return
		}
		*dst = v.value == "true"
	}
}

func (d *decoder) integer(v *node, p string, lo, hi int64, dst *int64) {
	if !d.scalar(v, p, "an integer") {
		return
	}
	n, err := strconv.ParseInt(v.value, 10, 64)
	if v.tag != "!!int" || err != nil {
		want := "an integer"
		if v.tag == "!!int" {
			want = "a decimal integer" // 0x10, 0o17, 1_000 are YAML integers too
		}
		d.fail(p, "must be "+want+" (got "+tagged(v)+strconv.Quote(v.value)+")")
		return
	}
	if n < lo || n > hi {
		d.fail(p, "must be in "+itoa(lo)+".."+itoa(hi)+" (got "+itoa(n)+")")
		return
	}
	*dst = n
}

// fixed reads a decimal number with at most `decimals` places into an
// integer scaled by 10^decimals, without float arithmetic, so every build
// reads the same value.
func (d *decoder) fixed(v *node, p string, decimals int, lo, hi int64, dst *int64) {
	if !d.scalar(v, p, "a number") {
		return
	}
	tag := v.tag
	n, ok := parseFixed(v.value, decimals)
	if tag != "!!int" && tag != "!!float" || !ok {
		d.fail(p, "must be a decimal number with at most "+itoa(decimals)+" decimal places (got "+tagged(v)+strconv.Quote(v.value)+")")
		return
	}
	if n < lo || n > hi {
		d.fail(p, "must be in "+fmtFixed(lo, decimals)+".."+fmtFixed(hi, decimals)+" (got "+v.value+")")
		return
	}
	*dst = n
}

func parseFixed(s string, decimals int) (int64, bool) {
	intPart, frac, _ := strings.Cut(s, ".")
	if !isDigits(intPart) || (frac != "" && !isDigits(frac)) || len(frac) > decimals || len(intPart) > 12 {
		return 0, false
	}
	n, _ := strconv.ParseInt(intPart, 10, 64)
	for i := 0; i < decimals; i++ {
		n *= 10
		if i < len(frac) {
			n += int64(frac[i] - '0')
		}
	}
	return n, true
}

func fmtFixed(n int64, decimals int) string {
	s := strconv.FormatFloat(float64(n)/math.Pow10(decimals), 'f', -1, 64)
	return s
}

func (d *decoder) duration(v *node, p string, dst *int64) {
	const want = `a duration such as "250ms", "1s" or "1h"`
	if !d.scalar(v, p, want) {
		return
	}
	dur, ok := parseDuration(v.value)
	if v.tag == "!!str" && !ok && durationSyntax(v.value) {
		// Well written, but past what a time.Duration holds.
		if strings.HasPrefix(v.value, "-") {
			d.fail(p, "must not be negative (got "+v.value+")")
		} else {
			d.fail(p, "must be at most "+durationString(math.MaxInt64-math.MaxInt64%1_000_000)+" (got "+v.value+")")
		}
		return
	}
	if v.tag != "!!str" || !ok {
		d.fail(p, "must be "+want+" (got "+tagged(v)+v.value+")")
		return
	}
	switch {
	case dur < 0:
		d.fail(p, "must not be negative (got "+v.value+")")
	case dur%1e6 != 0:
		d.fail(p, "must be a whole number of milliseconds (got "+v.value+")")
	default:
		*dst = dur / 1e6
	}
}

// durationSyntax reports whether s is written as a Go duration ("1h30m",
// "-1.5s"), whatever its size: time.ParseDuration gives the same error for
// bad syntax and for values past about 292 years.
func durationSyntax(s string) bool {
	if s != "" && (s[0] == '-' || s[0] == '+') {
		s = s[1:]
	}
	isNum := func(c byte) bool { return c >= '0' && c <= '9' || c == '.' }
	for s != "" {
		i := 0
		for i < len(s) && isNum(s[i]) {
			i++
		}
		if num := s[:i]; num == "" || num == "." || strings.Count(num, ".") > 1 {
			return false
		}
		j := i
		for j < len(s) && !isNum(s[j]) {
			j++
		}
		switch s[i:j] {
		case "ns", "us", "µs", "μs", "ms", "s", "m", "h":
		default:
			return false
		}
		s = s[j:]
	}
	return true
}

func (d *decoder) strings(v *node, p string, dst *[]string) {
	if v.kind != sequenceNode || v.tag != "!!seq" {
		d.fail(p, "must be a list of strings")
		return
	}
	if len(v.content) > MaxListItems {
		d.fail(p, "must have at most "+itoa(MaxListItems)+" items (got "+itoa(len(v.content))+")")
		return
	}
	out := []string{}
	for i, e := range v.content {
		var s string
		ep := p + "[" + itoa(i) + "]"
		d.str(e, ep, &s)
		if s == "" && e.tag == "!!str" {
			d.fail(ep, "must not be empty")
		}
		out = append(out, s)
	}
	*dst = out
}

// rules reads a classification table: an object from key to class name.
func (d *decoder) rules(v *node, p string, checkKey func(string) (string, string)) []rule {
	if !d.object(v, p) {
		return nil
	}
	norm := func(k string) string {
		if key, problem := checkKey(k); problem == "" {
			return key
		}
		return k
	}
	entries := d.entries(v, p, norm)
	if len(entries) > MaxTableEntries {
		d.fail(p, "must have at most "+itoa(MaxTableEntries)+" entries (got "+itoa(len(entries))+")")
		return nil
	}
	var out []rule
	seen := map[string]bool{}
	for _, e := range entries {
		k, val := e.k, e.v
		kp := join(p, k.value)
		d.lines[kp], d.line = k.line, k.line
		key, problem := checkKey(k.value)
		switch {
		case problem != "":
			d.fail(kp, problem)
			continue
		case seen[key]:
			d.fail(kp, "duplicate key")
			continue
		}
		seen[key] = true
		var class string
		d.enum(val, kp, classNames[:], &class)
		if class != "" {
			out = append(out, rule{key: key, class: class})
		}
	}
	return out
}

// slidingWindow reads circuit_breaker.sliding_window: {type: count, size:
// N calls} or {type: time, size: a duration in whole seconds}. The size is
// read once the type is known, whatever the order of the two.
func (d *decoder) slidingWindow(v *node, p string, c *rawCircuit) {
	kind := "count"
	var size *node
	d.fields(v, p, map[string]func(*node, string){
		"type": func(v *node, p string) { d.enum(v, p, []string{"count", "time"}, &kind) },
		"size": func(v *node, p string) { size = v },
	})
	if v.kind != mappingNode {
		return // reported by fields
	}
	c.windowByTime = kind == "time"
	sp := join(p, "size")
	switch {
	case size == nil:
		d.fail(sp, "required: the last N calls (type count) or a duration such as 60s (type time)")
	case kind == "count":
		d.integer(size, sp, 1, MaxWindowCalls, &c.windowSize)
	default:
		var win int64 = -1
		d.duration(size, sp, &win)
		switch {
		case win < 0: // reported
		case win%1000 != 0 || win < 1000 || win > MaxWindowSeconds*1000:
			d.fail(sp, "must be a whole number of seconds in 1s.."+itoa(MaxWindowSeconds)+"s (got "+size.value+")")
		default:
			c.windowSize = win / 1000
		}
	}
}

// lintIgnore reads lint_ignore: an object from lint code to the reason the
// policy has for it. Codes add to those of the preset it extends.
func (d *decoder) lintIgnore(v *node, p string, r *rawPolicy) {
	if !d.object(v, p) {
		return
	}
	out := map[string]string{}
	for code, why := range r.lintIgnore {
		out[code] = why
	}
	seen := map[string]bool{}
	for _, e := range d.entries(v, p, nil) {
		kp := join(p, e.key)
		d.lines[kp], d.line = e.k.line, e.k.line
		switch {
		case seen[e.key]:
			d.fail(kp, "duplicate key")
			continue
		case !isLintCode(e.key):
			d.fail(kp, "unknown lint code (codes: "+lintCodeList()+")")
			continue
		}
		seen[e.key] = true
		var why string
		d.str(e.v, kp, &why)
		if strings.TrimSpace(why) == "" && e.v.kind == scalarNode && e.v.tag == "!!str" {
			d.fail(kp, "must state the reason the lint does not apply (got an empty string)")
			continue
		}
		out[e.key] = why
	}
	r.lintIgnore = out
}

func httpKey(k string) (string, string) {
	if len(k) == 3 && (k[1] == 'x' || k[1] == 'X') && (k[2] == 'x' || k[2] == 'X') && k[0] >= '1' && k[0] <= '5' {
		return k[:1] + "xx", ""
	}
	if n, err := strconv.Atoi(k); err == nil && n >= 100 && n <= 599 {
		return strconv.Itoa(n), ""
	}
	return "", "must be an HTTP status 100..599 or a range such as 5xx (got " + strconv.Quote(k) + ")"
}

func grpcKey(k string) (string, string) {
	for code, name := range grpccode.Names() {
		if code > 0 && (strings.EqualFold(k, name) || k == strconv.Itoa(code)) {
			return strconv.Itoa(code), ""
		}
	}
	return "", "must be a gRPC status name such as UNAVAILABLE or a code 1..16 (got " + strconv.Quote(k) + ")"
}

func kindKey(k string) (string, string) {
	if k == "" {
		return "", "must not be empty"
	}
	return k, ""
}
