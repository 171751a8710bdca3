package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// readLibrary parses data with go.yaml.in/yaml/v3, the whole of YAML: the
// oracle readYAML is held to (policy files are read with readYAML alone,
// natively and in backstop.wasm). It returns a nil root when data holds no
// document.
func readLibrary(data []byte) (*node, *FieldError) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &FieldError{Field: "(document)", Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, nil
	}
	return fromLib(doc.Content[0], map[*yaml.Node]*node{}), nil
}

// fromLib converts a yaml.Node tree, following aliases to the node their
// anchor marks. seen keeps one node per yaml.Node, so shared nodes stay
// shared and a cycle ends.
func fromLib(n *yaml.Node, seen map[*yaml.Node]*node) *node {
	for i := 0; i < 8 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	if c, ok := seen[n]; ok {
		return c
	}
	c := &node{tag: n.ShortTag(), tagged: n.Style&yaml.TaggedStyle != 0, value: n.Value, line: n.Line}
	seen[n] = c
	switch n.Kind {
	case yaml.ScalarNode:
		c.kind = scalarNode
	case yaml.MappingNode:
		c.kind = mappingNode
	case yaml.SequenceNode:
		c.kind = sequenceNode
	}
	for _, e := range n.Content {
		c.content = append(c.content, fromLib(e, seen))
	}
	return c
}

// subsetCorpus returns the policy files of the repository, each of which
// the YAML subset must read as go.yaml.in/yaml/v3 does: the presets; every
// policy of testdata/vectors as the hosts send it (Go's and Python's JSON,
// indented JSON) and as block YAML; the yaml and json code blocks of the
// docs and READMEs.
func subsetCorpus(t testing.TB) map[string]string {
	corpus := map[string]string{}
	for _, name := range PresetNames() {
		text, _ := PresetText(name)
		corpus["preset "+name] = text
	}
	data, err := os.ReadFile("../testdata/vectors/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors struct {
		Groups []struct {
			Name   string         `json:"name"`
			Policy map[string]any `json:"policy"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &vectors); err != nil {
		t.Fatal(err)
	}
	for _, g := range vectors.Groups {
		compact, _ := json.Marshal(g.Policy)
		indented, _ := json.MarshalIndent(g.Policy, "", "  ")
		block, _ := yaml.Marshal(g.Policy)
		corpus["vector "+g.Name+" json"] = string(compact)
		corpus["vector "+g.Name+" indented json"] = string(indented)
		// Python's json.dumps separates with ", " and ": ".
		corpus["vector "+g.Name+" python json"] = pythonJSON(compact)
		corpus["vector "+g.Name+" yaml"] = string(block)
	}
	docs, _ := filepath.Glob("../docs/*.md")
	more, _ := filepath.Glob("../*/README.md")
	hosts, _ := filepath.Glob("../sdk/*/README.md")
	block := regexp.MustCompile("(?s)```(?:yaml|json)\n(.*?)```")
	for _, f := range append(append(append(docs, more...), hosts...), "../README.md") {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllStringSubmatch(string(text), -1) {
			corpus[f+" block "+strconv.Itoa(i)] = m[1]
		}
	}
	return corpus
}

// pythonJSON respaces Go's compact JSON as json.dumps writes it.
func pythonJSON(compact []byte) string {
	var b strings.Builder
	inString := false
	for i := 0; i < len(compact); i++ {
		c := compact[i]
		b.WriteByte(c)
		switch {
		case inString && c == '\\':
			i++
			b.WriteByte(compact[i])
		case c == '"':
			inString = !inString
		case !inString && (c == ',' || c == ':'):
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// fuzzString reads the one string or []byte of a "go test fuzz v1" file.
func fuzzString(file string) (string, bool) {
	_, arg, ok := strings.Cut(file, "\n")
	arg = strings.TrimSpace(arg)
	if s, found := strings.CutPrefix(arg, "[]byte("); found {
		arg = strings.TrimSuffix(s, ")")
	} else if s, found := strings.CutPrefix(arg, "string("); found {
		arg = strings.TrimSuffix(s, ")")
	}
	v, err := strconv.Unquote(arg)
	return v, ok && err == nil
}

// subsetEdgeCases are inputs near the subset's edges: each is either read
// as the library reads it, or refused.
var subsetEdgeCases = []string{
	"", "# only a comment\n", "---\n", "--- {a: 1}\n", "---\na: 1\n...\n", "\ufeffa: 1",
	"a: 1\r\nb: [x, y]\r\n", "a:\n  b: 1\n  c:\n    - x\n    - 'y'\nd: 2\n", "a:\n- x\n- y\nb: 1\n",
	"a: b: c\n", "a: 'it''s'\n", `a: "\u00e9\t\x41\/\\"` + "\n", `a: "\ud800"`, "a: b #c\n", "a: b#c\n",
	"a: [1, 2.5, -3, 0x1F, 0o17, 1_000, 1e3, .5, +.inf, .NaN, ~, null, true, False, <<]\n",
	"a: 2001-12-14\n", "a: 1:30\n", "a: :x\n", "a: -x\n", "a: - x\n", "a: [a, b,]\n", "a: {b, c: 1}\n",
	"a: {b: }\n", "a: {b: 1,\n  c: 2}\n", "a: [x\n  y]\n", "a: [\"x\"y]\n", "a: &x 1\n", "a: *x\n",
	"a: !!str 3\n", "a: |\n  x\n", "a: >\n  x\n", "? a\n: 1\n", "%YAML 1.2\n---\na: 1\n", "a:\tb\n",
	"\ta: 1\n", "a: 1\n b: 2\n", "a:\n  b: 1\n c: 2\n", "a: 1\n  # comment\nb: 2\n", "a: x\n  y\n",
	"a: \"x\n  y\"\n", "a: 'x\n", "[1, 2]\n", "\"just a string\"\n", "plain\n", "- a\n- b\n", "- a: 1\n",
	"a: {\"b\":1,\"c\":[\"x\",\"y\"]}\n", `{"a":{"b":"c"}}`, "{\n  \"a\": 1\n}\n", "{\n\t\"a\": 1\n}\n",
	"a:\n\n  b: 1\n", "a: 1 # x: y\n", "\"a\" : 1\n", "'a': 1\n", "a : 1\n", "a: [b, [c, {d: e}]]\n",
	"a: {b: [1, 2], c: {d: 3}}\n", "a: \"\"\n", "a: ''\n", "\"\": 1\n", "a: -\n", "a: --x\n", "a: 12:30:00\n",
	"a: 0b101\n", "a: -0b101\n", "a: 9223372036854775808\n", "a: 18446744073709551616\n", "a: 1e400\n",
	"a: 0x\n", "a: +1\n", "a: +\n", "a: 1.\n", "a: 01\n", "a: 1_\n", "a: _1\n", "a: .\n", "a: ...\n",
	"a: [---]\n", "a: x,y\n", "a: {x: [a, b], y: z}\n", "a: '#'\n", "a: \"#\"\n", "a: b ## c\n",
	"a: [a #c\n, b]\n", "a: [a, #c\n b]\n", "a: \"\\N\\_\\L\\P\\e\\0\"\n", "a: \"\\x\"\n", "a: \"\\q\"\n",
	"a:\n  - x\n  -\n", "a:\n  -\n    b\n", "a: [a: 1]\n", "a: [,]\n", "a: {,}\n", "a: {}\n", "a: []\n",
	"a:\n  b:\n  c: 1\n", "a:\n", "a: 1\nb:\n", "a: 1\n---\nb: 2\n", "a: 1\n...\n", "a: µs\n", "a: \u0085\n",
}

func TestSubsetMatchesLibrary(t *testing.T) {
	for name, text := range subsetCorpus(t) {
		lib, libErr := readLibrary([]byte(text))
		sub, subErr := readYAML([]byte(text))
		if subErr != nil {
			t.Errorf("%s: the subset refuses a policy file of the repository: %v\n%s", name, subErr, text)
			continue
		}
		if libErr != nil {
			t.Errorf("%s: the subset reads what the library refuses (%v)", name, libErr)
			continue
		}
		if diff := sameNode(lib, sub, ""); diff != "" {
			t.Errorf("%s: %s\n%s", name, diff, text)
		}
	}
	for _, text := range subsetEdgeCases {
		checkSubset(t, []byte(text))
	}
	seeds, _ := filepath.Glob("testdata/fuzz/FuzzParse/*")
	for _, f := range seeds {
		text, _ := os.ReadFile(f)
		if v, ok := fuzzString(string(text)); ok {
			checkSubset(t, []byte(v))
		}
	}
}

// TestSubsetErrorsNameLineAndField: what the subset refuses is an error
// with the line, the key it was under and the feature.
func TestSubsetErrorsNameLineAndField(t *testing.T) {
	for text, want := range map[string]string{
		"backoff:\n  base: &b 1s\n":                     `backoff.base: line 2: anchors and aliases are not supported (found the anchor "&b"): write the value out`,
		"a: 1\nretry_after:\n  cap: *b\n":               `retry_after.cap: line 3: anchors and aliases are not supported (found the alias "*b"): write out the value`,
		"name: |\n  x\n":                                "name: line 1: block scalars (| and >) are not supported: write the value on the key's line",
		"idempotency: {never_sent_kinds: [a, !!str b]}": `idempotency.never_sent_kinds[1]: line 1: tags are not supported (found the tag "!!str"): remove the tag`,
		"name: 2001-12-14\n":                            "name: line 1: a value that reads as a date or timestamp (\"2001-12-14\") is not supported: quote it",
		"jitter:\n  mode: full\n   x: 1\n":              "jitter.mode: line 3: unexpected content at indentation 3",
	} {
		_, fe := readYAML([]byte(text))
		if fe == nil || !strings.Contains(fe.Error(), want) || fe.Line == 0 {
			t.Errorf("readYAML(%q) = %v, want %q", text, fe, want)
		}
	}
}

// checkSubset fails when the subset reads data and the library refuses it
// or reads it otherwise, or when the library refuses data and the subset
// does not.
func checkSubset(t *testing.T, data []byte) {
	t.Helper()
	if secondDocument(data) > 0 {
		return // document refuses it whichever reader ran (the library may find a syntax error first)
	}
	lib, libErr := readLibrary(data)
	sub, subErr := readYAML(data)
	switch {
	case subErr != nil:
		if subErr.Line < 1 || subErr.Field == "" {
			t.Errorf("readYAML(%q) = %#v: no line or field", data, subErr)
		}
	case libErr != nil:
		t.Errorf("readYAML(%q) reads what the library refuses (%v)", data, libErr)
	default:
		if diff := sameNode(lib, sub, ""); diff != "" {
			t.Errorf("readYAML(%q): %s", data, diff)
		}
	}
}

// sameNode returns how two node trees differ, "" when they do not.
func sameNode(a, b *node, path string) string {
	switch {
	case a == nil && b == nil:
		return ""
	case a == nil || b == nil:
		return path + ": library " + strconv.FormatBool(a != nil) + ", subset " + strconv.FormatBool(b != nil)
	case a.kind != b.kind || a.tag != b.tag || a.tagged != b.tagged || a.value != b.value || a.line != b.line ||
		len(a.content) != len(b.content):
		return path + ": library " + nodeText(a) + ", subset " + nodeText(b)
	}
	for i := range a.content {
		if d := sameNode(a.content[i], b.content[i], path+"/"+strconv.Itoa(i)); d != "" {
			return d
		}
	}
	return ""
}

func nodeText(n *node) string {
	return "{kind " + strconv.Itoa(int(n.kind)) + " tag " + n.tag + " tagged " + strconv.FormatBool(n.tagged) +
		" value " + strconv.Quote(n.value) + " line " + strconv.Itoa(n.line) + " items " + strconv.Itoa(len(n.content)) + "}"
}

// FuzzSubset holds the subset to the library on any input: what the subset
// reads, the library reads the same way. Its seeds are the repository's
// policy files and the edge cases above.
func FuzzSubset(f *testing.F) {
	for _, text := range subsetCorpus(f) {
		f.Add([]byte(text))
	}
	for _, text := range subsetEdgeCases {
		f.Add([]byte(text))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > MaxFileBytes {
			return
		}
		// A reader stuck in a loop would stall the fuzzer without a word:
		// crash instead, so the input is saved. (No input takes a second.)
		tm := time.AfterFunc(30*time.Second, func() { panic("readers still busy after 30s on " + strconv.Quote(string(data))) })
		defer tm.Stop()
		checkSubset(t, data)
	})
}

func TestDurationMatchesTime(t *testing.T) {
	for _, s := range []string{"", "0", "-0", "+0", "1s", "-1.5h", "1h30m", "250ms", "1µs", "1μs", "1us", "1ns",
		".5s", "5.s", ".s", "1", "1x", "1.5", "9223372036854775807ns", "9223372036854775808ns",
		"-9223372036854775808ns", "2562047h47m16.854775807s", "2562048h", "0.000000001s", "1.0000000001s",
		"1.99999999999999999999h", "3h-1m", "1e3s", "+5m", "--1s", "1ss", "100000000000000000000s"} {
		checkDuration(t, s)
	}
	for _, d := range []time.Duration{0, 1, 999, 1000, 1500, 999999, 1e6, 1e9, 61e9, 3601e9 + 5e8, -1, -61e9,
		1<<63 - 1, -1 << 63, 300 * time.Second} {
		if got, want := durationString(int64(d)), d.String(); got != want {
			t.Errorf("durationString(%d) = %q, want %q", int64(d), got, want)
		}
	}
}

func checkDuration(t *testing.T, s string) {
	t.Helper()
	want, err := time.ParseDuration(s)
	got, ok := parseDuration(s)
	if ok != (err == nil) || (ok && got != int64(want)) {
		t.Errorf("parseDuration(%q) = %d, %v; time.ParseDuration = %d, %v", s, got, ok, want, err)
	}
	if ok && durationString(got) != want.String() {
		t.Errorf("durationString(%d) = %q, want %q", got, durationString(got), want.String())
	}
}

func FuzzDuration(f *testing.F) {
	for _, s := range []string{"1s", "-1.5h", "1h30m", ".5µs", "9223372036854775807ns", "1.99999999999999999999h"} {
		f.Add(s)
	}
	f.Fuzz(checkDuration)
}
