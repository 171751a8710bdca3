package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/backstop-dev/backstop/policy"
)

// policyImport turns another system's retry settings into a backstop
// policy file: a Cloud Tasks RetryConfig (as gcloud, the REST API or
// `terraform show -json` print it) or Spring Retry properties (Spring Boot's
// *.retry.* or Spring Cloud Stream's back-off-*, properties or YAML). The
// result is printed as JSON, after policy.Parse has accepted it.
func policyImport(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("policy import")
	from := fs.String("from", "auto", "what the file holds: cloud-tasks, spring or auto (told by its field names)")
	prefix := fs.String("prefix", "", "the key prefix of the settings to import, when a file holds several (spring.cloud.stream.bindings.input.consumer)")
	name := fs.String("name", "", "the policy's name (default: the Cloud Tasks queue's name, when the file has one)")
	pos, err := parseFlags(fs, args, "FILE (or - for stdin)")
	if err != nil {
		return err
	}
	src, err := readImport(pos[0], stdin)
	if err != nil {
		return err
	}
	keys, err := flatKeys(src)
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	kind := *from
	if kind == "auto" {
		if kind, err = detectFormat(keys); err != nil {
			return fmt.Errorf("%s: %w", pos[0], err)
		}
	}
	var out importedPolicy
	switch kind {
	case "cloud-tasks":
		out, err = fromCloudTasks(keys, *prefix, stderr)
	case "spring":
		out, err = fromSpring(keys, *prefix, stderr)
	default:
		return fmt.Errorf("--from: must be cloud-tasks, spring or auto (got %q)", kind)
	}
	if err != nil {
		if lines := strings.Split(err.Error(), "\n"); len(lines) > 1 {
			// One problem a line, as policy check lists them.
			return fmt.Errorf("%s: cannot import\n  %s", pos[0], strings.Join(lines, "\n  "))
		}
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	if *name != "" {
		out.Name = *name
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	// What is printed is a policy every host loads: prove it before printing.
	if _, err := policy.Parse(b); err != nil {
		return problems("imported policy", err)
	}
	_, err = stdout.Write(b)
	return err
}

// readImport reads the file, or stdin for "-", refusing more than a
// policy file's limit: retry settings are a few lines.
func readImport(arg string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if arg != "-" {
		f, err := os.Open(arg)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, policy.MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > policy.MaxFileBytes {
		return nil, fmt.Errorf("%s: must be at most %d bytes", arg, policy.MaxFileBytes)
	}
	return b, nil
}

// importedPolicy is the policy file import prints, in this field order.
type importedPolicy struct {
	Name        string          `json:"name,omitempty"`
	Extends     string          `json:"extends,omitempty"`
	MaxAttempts int64           `json:"max_attempts"`
	MaxElapsed  string          `json:"max_elapsed,omitempty"`
	StopWhen    string          `json:"stop_when,omitempty"`
	Backoff     importedBackoff `json:"backoff"`
	Jitter      struct {
		Mode string `json:"mode"`
	} `json:"jitter"`
}

type importedBackoff struct {
	Strategy     string      `json:"strategy"`
	Base         string      `json:"base"`
	Multiplier   json.Number `json:"multiplier,omitempty"`
	Cap          string      `json:"cap"`
	MaxDoublings int64       `json:"max_doublings"`
}

// flatValue is one scalar of the input, under its dotted key.
type flatValue struct {
	key, text string
}

// flatKeys reads YAML or JSON (an object) or a .properties file into its
// scalars, keyed by dotted path: retryConfig.maxAttempts,
// spring.cloud.stream.bindings.input.consumer.max-attempts. A list of one
// object (terraform show -json's retry_config) counts as the object.
func flatKeys(src []byte) ([]flatValue, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err == nil && len(doc.Content) == 1 && doc.Content[0].Kind == yaml.MappingNode {
		var out []flatValue
		flattenNode(doc.Content[0], "", &out, 0)
		return out, nil
	}
	return propertiesLines(src)
}

func flattenNode(n *yaml.Node, path string, out *[]flatValue, depth int) {
	if depth > 32 {
		return
	}
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			flattenNode(n.Content[i+1], keyJoin(path, n.Content[i].Value), out, depth+1)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := path
			if len(n.Content) > 1 {
				p = fmt.Sprintf("%s[%d]", path, i)
			}
			flattenNode(c, p, out, depth+1)
		}
	case yaml.ScalarNode:
		*out = append(*out, flatValue{key: path, text: n.Value})
	}
}

func keyJoin(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// properties reads key=value (or key: value) lines; # and ! start
// comments.
func propertiesLines(src []byte) ([]flatValue, error) {
	var out []flatValue
	sc := bufio.NewScanner(bytes.NewReader(src))
	for line := 1; sc.Scan(); line++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' || l[0] == '!' {
			continue
		}
		i := strings.IndexAny(l, "=:")
		if i <= 0 {
			return nil, fmt.Errorf("line %d: neither a JSON or YAML object nor a properties line (key=value): %q", line, l)
		}
		out = append(out, flatValue{key: strings.TrimSpace(l[:i]), text: strings.TrimSpace(l[i+1:])})
	}
	if len(out) == 0 {
		return nil, errors.New("no settings found: expected a JSON or YAML object or a properties file")
	}
	return out, nil
}

// field returns the last segment of a dotted key, relaxed as Spring binds
// it: lower case, without - and _ (maxBackoff, max_backoff, max-backoff).
func lastField(key string) string {
	last := key[strings.LastIndex(key, ".")+1:]
	return strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(last))
}

func prefixOf(key string) string {
	if i := strings.LastIndex(key, "."); i >= 0 {
		return key[:i]
	}
	return ""
}

var (
	cloudTasksFields = map[string]bool{"maxattempts": true, "minbackoff": true, "maxbackoff": true, "maxdoublings": true, "maxretryduration": true}
	springFields     = map[string]bool{"maxattempts": true, "initialinterval": true, "multiplier": true, "maxinterval": true,
		"backoffinitialinterval": true, "backoffmultiplier": true, "backoffmaxinterval": true}
)

// detect tells a Cloud Tasks RetryConfig from Spring properties by the
// fields only one of them has.
func detectFormat(keys []flatValue) (string, error) {
	for _, k := range keys {
		if f := lastField(k.key); cloudTasksFields[f] && f != "maxattempts" {
			return "cloud-tasks", nil
		}
	}
	for _, k := range keys {
		if f := lastField(k.key); springFields[f] && f != "maxattempts" {
			return "spring", nil
		}
	}
	return "", errors.New("found neither a Cloud Tasks RetryConfig (minBackoff, maxBackoff, maxDoublings…) nor Spring Retry properties (initial-interval, multiplier, max-interval…): name one with --from")
}

// pick returns the known fields under one prefix: the one given, or the
// only one the file has.
func pickPrefix(keys []flatValue, known map[string]bool, want string, springNesting bool) (map[string]flatValue, string, error) {
	byPrefix := map[string]map[string]flatValue{}
	for _, k := range keys {
		f := lastField(k.key)
		if !known[f] {
			continue
		}
		p := prefixOf(k.key)
		if springNesting && lastField(p) == "backoff" {
			// spring.retry.backoff.initial-interval sits beside
			// spring.retry.max-attempts.
			p = prefixOf(p)
		}
		if byPrefix[p] == nil {
			byPrefix[p] = map[string]flatValue{}
		}
		byPrefix[p][f] = k
	}
	if want != "" {
		if m, ok := byPrefix[want]; ok {
			return m, want, nil
		}
	}
	var names []string
	for p := range byPrefix {
		names = append(names, strconv.Quote(p))
	}
	sort.Strings(names)
	switch {
	case want != "":
		return nil, "", fmt.Errorf("--prefix: no retry settings under %q (found them under %s)", want, orNone(names))
	case len(byPrefix) == 1:
		for p, m := range byPrefix {
			return m, p, nil
		}
	case len(byPrefix) > 1:
		return nil, "", fmt.Errorf("retry settings under %d prefixes (%s): choose one with --prefix", len(byPrefix), strings.Join(names, ", "))
	}
	return nil, "", errors.New("no retry settings found")
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "no prefix"
	}
	return strings.Join(names, ", ")
}

// cloudTasksDefaults are what Cloud Tasks gives a queue created without a
// field of its RetryConfig (the reference's documented defaults), keyed
// by lastField's spelling.
var cloudTasksDefaults = map[string]string{"maxattempts": "100", "minbackoff": "0.100s", "maxbackoff": "3600s", "maxdoublings": "16"}

var upperRE = regexp.MustCompile(`([A-Z])`)

// fromCloudTasks maps a RetryConfig onto the cloud_tasks strategy. The
// reference: https://cloud.google.com/tasks/docs/reference/rest/v2/RetryConfig
// A field the file leaves out takes Cloud Tasks' default, and the command
// says so on stderr.
func fromCloudTasks(keys []flatValue, prefix string, stderr io.Writer) (importedPolicy, error) {
	var out importedPolicy
	m, p, err := pickPrefix(keys, cloudTasksFields, prefix, false)
	if err != nil {
		return out, err
	}
	var errs []error
	fail := func(f flatValue, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", f.key, fmt.Sprintf(format, a...)))
	}
	snake := false // spell a missing field as the file spells the others
	for _, v := range m {
		snake = snake || strings.Contains(v.key[strings.LastIndex(v.key, ".")+1:], "_")
	}
	field := func(name, camel string) flatValue {
		if v, ok := m[name]; ok {
			return v
		}
		spelled := camel
		if snake {
			spelled = strings.ToLower(upperRE.ReplaceAllString(camel, "_$1"))
		}
		v := flatValue{key: keyJoin(p, spelled), text: cloudTasksDefaults[name]}
		fmt.Fprintf(stderr, "backstop: %s not set: Cloud Tasks' default, %s\n", v.key, v.text)
		m[name] = v
		return v
	}
	attempts, minB, maxB, doublings := field("maxattempts", "maxAttempts"), field("minbackoff", "minBackoff"),
		field("maxbackoff", "maxBackoff"), field("maxdoublings", "maxDoublings")
	n, err := strconv.ParseInt(attempts.text, 10, 32)
	switch {
	case err != nil:
		fail(attempts, "must be an integer (got %q)", attempts.text)
	case n == -1:
		out.MaxAttempts = 0 // unlimited
	case n < 1 || n > 1_000_000:
		fail(attempts, "must be -1 (unlimited) or in 1..1000000 (got %d)", n)
	default:
		out.MaxAttempts = n
	}
	minMs, maxMs := ctDuration(minB, fail), ctDuration(maxB, fail)
	if minMs == 0 {
		fail(minB, "must be > 0 (got %s)", minB.text)
	}
	if maxMs >= 0 && minMs > 0 && maxMs < minMs {
		fail(maxB, "must be >= %s (got %s < %s)", minB.key, maxB.text, minB.text)
	}
	n, err = strconv.ParseInt(doublings.text, 10, 32)
	switch {
	case err != nil:
		fail(doublings, "must be an integer (got %q)", doublings.text)
	case n < 0 || n > 1000:
		fail(doublings, "must be in 0..1000 (got %d)", n)
	default:
		out.Backoff.MaxDoublings = n
	}
	var durMs int64
	if v, ok := m["maxretryduration"]; ok { // absent: 0, as the API prints it
		durMs = ctDuration(v, fail)
	}
	if len(errs) == 0 && out.MaxAttempts == 0 && durMs <= 0 {
		errs = append(errs, fmt.Errorf("%s: -1 (unlimited) with no maxRetryDuration retries until Cloud Tasks' task retention limit, and backstop needs a limit: set %s", m["maxattempts"].key, keyJoin(p, "maxRetryDuration")))
	}
	if len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	if durMs > 0 {
		// Cloud Tasks stops only when both limits are reached, and checks
		// the duration when a failure happens: stop_when all.
		out.MaxElapsed, out.StopWhen = msText(durMs), "all"
	}
	out.Backoff.Strategy, out.Backoff.Base, out.Backoff.Cap = "cloud_tasks", msText(minMs), msText(maxMs)
	out.Jitter.Mode = "none" // Cloud Tasks documents no jitter
	// The rest of a queue's behaviour (every non-2xx retried, whatever the
	// method; the stop rule; the lints it breaks on purpose) is the preset's.
	out.Extends = "cloud-tasks"
	if v, ok := lookupKey(keys, keyJoin(prefixOf(p), "name")); ok && strings.Contains(v.text, "/queues/") {
		out.Name = v.text[strings.LastIndex(v.text, "/")+1:]
	}
	return out, nil
}

func lookupKey(keys []flatValue, key string) (flatValue, bool) {
	for _, k := range keys {
		if k.key == key {
			return k, true
		}
	}
	return flatValue{}, false
}

// ctDuration reads a google.protobuf.Duration as the API writes it
// ("0.100s", "3600s"), or a gcloud flag value ("10m"), in whole
// milliseconds; -1 after a problem.
func ctDuration(v flatValue, fail func(flatValue, string, ...any)) int64 {
	d, err := time.ParseDuration(v.text)
	switch {
	case err != nil: // a bare number too: the API always writes the unit
		fail(v, `must be a duration such as "0.100s" or "3600s" (got %s)`, v.text)
	case d < 0:
		fail(v, "must not be negative (got %s)", v.text)
	case d%time.Millisecond != 0:
		fail(v, "must be a whole number of milliseconds (got %s)", v.text)
	default:
		return d.Milliseconds()
	}
	return -1
}

// Spring's defaults for the settings a file leaves out: Spring Cloud
// Stream's consumer properties (back-off-*), and Spring Boot's retry
// properties (spring.rabbitmq.listener.simple.retry.*, ...).
var (
	streamDefaults = map[string]string{"maxattempts": "3", "initialinterval": "1000", "multiplier": "2.0", "maxinterval": "10000"}
	bootDefaults   = map[string]string{"maxattempts": "3", "initialinterval": "1000ms", "multiplier": "1.0", "maxinterval": "10000ms"}
)

// fromSpring maps Spring Retry's ExponentialBackOffPolicy onto the
// exponential strategy: the first wait is initial-interval, each next one
// multiplier times the last, none above max-interval; max-attempts counts
// the first call, as backstop's max_attempts does.
func fromSpring(keys []flatValue, prefix string, stderr io.Writer) (importedPolicy, error) {
	var out importedPolicy
	m, p, err := pickPrefix(keys, springFields, prefix, true)
	if err != nil {
		return out, err
	}
	stream := strings.Contains(p, "cloud.stream")
	for f, v := range m {
		if name := strings.TrimPrefix(f, "backoff"); name != f {
			stream = true
			m[name] = v
			delete(m, f)
		}
	}
	defaults, which := bootDefaults, "Spring Boot's"
	if stream {
		defaults, which = streamDefaults, "Spring Cloud Stream's"
	}
	spelled := map[string]string{"maxattempts": "max-attempts", "initialinterval": "initial-interval", "multiplier": "multiplier", "maxinterval": "max-interval"}
	if stream {
		spelled = map[string]string{"maxattempts": "max-attempts", "initialinterval": "back-off-initial-interval", "multiplier": "back-off-multiplier", "maxinterval": "back-off-max-interval"}
	}
	get := func(f string) flatValue {
		if v, ok := m[f]; ok {
			return v
		}
		key := keyJoin(p, spelled[f])
		fmt.Fprintf(stderr, "backstop: %s not set: %s default, %s\n", key, which, defaults[f])
		return flatValue{key: key, text: defaults[f]}
	}
	var errs []error
	attempts := get("maxattempts")
	n, err := strconv.ParseInt(attempts.text, 10, 64)
	if err != nil || n < 1 || n > 1_000_000 {
		errs = append(errs, fmt.Errorf("%s: must be an integer in 1..1000000, counting the first call (got %q)", attempts.key, attempts.text))
	}
	out.MaxAttempts = n
	initial, errI := springInterval(get("initialinterval"))
	maxI, errM := springInterval(get("maxinterval"))
	mult := get("multiplier")
	milli, ok := multiplierMilli(mult.text)
	if ok && milli > 1_000_000 {
		errs = append(errs, fmt.Errorf("%s: must be at most 1000 (got %s)", mult.key, mult.text))
	} else if !ok {
		errs = append(errs, fmt.Errorf("%s: must be a decimal number with at most 3 decimal places, such as 2 or 1.5 (got %q)", mult.key, mult.text))
	}
	errs = append(errs, errI, errM)
	if err := errors.Join(errs...); err != nil {
		return out, err
	}
	if initial == 0 {
		return out, fmt.Errorf("%s: must be > 0", get("initialinterval").key)
	}
	// ExponentialBackOffPolicy takes a multiplier of 1 or less as 1, and
	// never sleeps longer than max-interval, even the first time.
	milli = max(milli, 1000)
	out.Backoff = importedBackoff{Strategy: "exponential", Base: msText(min(initial, maxI)), Cap: msText(maxI),
		Multiplier:   json.Number(strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%d.%03d", milli/1000, milli%1000), "0"), ".")),
		MaxDoublings: 1000} // no limit: the cap stops the growth
	out.Jitter.Mode = "none" // ExponentialBackOffPolicy has none
	return out, nil
}

var springDuration = regexp.MustCompile(`^(\d+)(ns|us|ms|s|m|h|d)?$`)

// springInterval reads a Spring interval: a bare number is milliseconds
// (Spring Cloud Stream's int, Spring Boot's Duration default unit), or a
// number with a unit as Spring Boot writes it ("500ms", "2s", "1d").
func springInterval(v flatValue) (int64, error) {
	s := springDuration.FindStringSubmatch(strings.TrimSpace(v.text))
	if s == nil {
		return 0, fmt.Errorf("%s: must be milliseconds or a duration such as 500ms, 2s or 1m (got %q)", v.key, v.text)
	}
	n, err := strconv.ParseInt(s[1], 10, 64)
	unit := map[string]time.Duration{"": time.Millisecond, "ns": 1, "us": time.Microsecond, "ms": time.Millisecond,
		"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[s[2]]
	d := time.Duration(n) * unit
	switch {
	case err != nil || d < 0 || d/unit != time.Duration(n):
		return 0, fmt.Errorf("%s: must be at most %s (got %q)", v.key, time.Duration(1<<63-1).Truncate(time.Millisecond), v.text)
	case d%time.Millisecond != 0:
		return 0, fmt.Errorf("%s: must be a whole number of milliseconds (got %q)", v.key, v.text)
	}
	return d.Milliseconds(), nil
}

// multiplierMilli reads a decimal such as "1.5" into thousandths without
// float arithmetic; "2.0" (a Java double as written) is fine.
func multiplierMilli(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	intPart, frac, _ := strings.Cut(s, ".")
	frac = strings.TrimRight(frac, "0")
	if intPart == "" || len(intPart) > 7 || len(frac) > 3 || strings.Trim(intPart, "0123456789") != "" || strings.Trim(frac, "0123456789") != "" {
		return 0, false
	}
	n, _ := strconv.ParseInt(intPart+(frac + "000")[:3], 10, 64)
	return n, true
}

// msText writes milliseconds as the shortest policy duration: 100ms, 10s,
// 5m, 1h, else Go's form (1m30s).
func msText(ms int64) string {
	switch {
	case ms == 0:
		return "0s"
	case ms%3_600_000 == 0:
		return fmt.Sprintf("%dh", ms/3_600_000)
	case ms%60_000 == 0:
		return fmt.Sprintf("%dm", ms/60_000)
	case ms%1000 == 0:
		return fmt.Sprintf("%ds", ms/1000)
	case ms < 1000:
		return fmt.Sprintf("%dms", ms)
	}
	return (time.Duration(ms) * time.Millisecond).String()
}
