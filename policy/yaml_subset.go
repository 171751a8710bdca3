package policy

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// readYAML is the one YAML reader of policy files, natively and in
// backstop.wasm alike, so a file that loads in one loads in every host. It
// parses the YAML that policy files are written in, and nothing more:
// JSON; block mappings and block sequences of scalars (a sequence may sit
// at its key's indentation); flow mappings and sequences over any number
// of lines; plain, 'single' and "double" quoted scalars on one line;
// comments, a leading "---" and a byte order mark. It returns a nil root
// when data holds no document. It stands in for go.yaml.in/yaml/v3, which
// links reflect, fmt, regexp and time's layout parser into backstop.wasm
// (most of the 1.7 MB the module lost: BENCHMARKS.md).
//
// Whatever it accepts, it reads as go.yaml.in/yaml/v3 does (the same nodes,
// tags, values and lines: TestSubsetMatchesLibrary and FuzzSubset, which
// hold it to the library, prove it). Anything else (anchors, aliases,
// tags, block scalars, multi-line scalars, complex keys, directives, tabs
// at the start of a line, plain scalars that would resolve to a timestamp)
// is an error naming the line, the key it was under, the feature and how
// to write the policy without it.
func readYAML(data []byte) (*node, *FieldError) {
	return (&subsetReader{}).document(data)
}

type subsetReader struct {
	lines [][]byte // without their line breaks; a line's number is its index+1
	row   int      // the current line
	col   int      // the current byte in it
	path  []string // the keys above the current node, for errors
}

// subsetError is returned (as a panic caught by document) with the line
// and the key path where the reader stopped.
type subsetError struct{ fe *FieldError }

func (r *subsetReader) fail(reason string) {
	field := strings.ReplaceAll(strings.Join(r.path, "."), ".[", "[") // "a.b[1]", as the decoder names it
	if field == "" {
		field = "(document)"
	}
	line := r.row + 1
	if line > len(r.lines) && len(r.lines) > 0 {
		line = len(r.lines)
	}
	panic(subsetError{&FieldError{Field: field, Line: line,
		Reason: "line " + itoa(line) + ": " + reason}})
}

// unsupported stops at a YAML feature outside the subset: what says which
// one ("... are not supported"), fix how to write the policy without it.
func (r *subsetReader) unsupported(what, fix string) {
	r.fail(what + ": " + fix)
}

func (r *subsetReader) document(data []byte) (root *node, fe *FieldError) {
	defer func() {
		if e := recover(); e != nil {
			se, ok := e.(subsetError)
			if !ok {
				panic(e)
			}
			root, fe = nil, se.fe
		}
	}()
	data = []byte(strings.TrimPrefix(string(data), "\ufeff"))
	for i := 0; i < len(data); {
		c, size := utf8.DecodeRune(data[i:])
		if !printable(c, size) {
			r.row = strings.Count(string(data[:i]), "\n")
			r.fail("the character " + strconv.Quote(string(data[i:i+size])) + " is not allowed (a control character, a YAML line break other than \\n, or invalid UTF-8)")
		}
		i += size
	}
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSuffix(l, "\r")
		r.lines = append(r.lines, []byte(l))
		if strings.IndexByte(l, '\r') >= 0 {
			r.row = len(r.lines) - 1
			r.unsupported("a carriage return inside a line is not supported", "end each line with \\n or \\r\\n")
		}
	}
	r.row = -1
	if !r.nextLine() {
		return nil, nil
	}
	if l := r.lines[r.row]; isMarker(l, "---") {
		if t := trimSpace(l[3:]); len(t) > 0 && t[0] != '#' {
			// "--- {max_attempts: 3}": a flow or scalar value on the marker's line
			r.col = 3 + (len(l[3:]) - len(trimLeft(l[3:])))
			r.checkPlainStart() // "--- &a {b: 1}": the anchor, not the block style
			if r.isKeyLine() {
				r.unsupported("an object in block style on the --- line is not supported", "start it on the line below the ---, or write it as {key: value}")
			}
			root = r.inlineValue(false)
			r.nextLine()
			return r.end(root), nil
		}
		if !r.nextLine() || isMarker(r.lines[r.row], "---") || isMarker(r.lines[r.row], "...") {
			r.row = 0
			r.unsupported("an empty document after --- is not supported", "write the policy below the ---")
		}
	}
	if isMarker(r.lines[r.row], "...") {
		r.unsupported("a document that starts with ... is not supported", "remove the ... line")
	}
	if l := r.lines[r.row]; l[0] == '%' {
		r.unsupported("directives (%YAML, %TAG) are not supported", "remove the line")
	}
	return r.end(r.blockNode(-1)), nil
}

// end checks that nothing but a document marker follows the root node
// (secondDocument, shared with the native reader, reports what follows a
// marker).
func (r *subsetReader) end(root *node) *node {
	if r.row < len(r.lines) {
		l := r.lines[r.row]
		if !isMarker(l, "---") && !isMarker(l, "...") {
			r.fail("unexpected content at indentation " + itoa(r.col) + " (check the indentation of this line)")
		}
	}
	return root
}

func trimLeft(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// printable is YAML's (and go.yaml.in/yaml/v3's) set of characters a
// document may hold.
func printable(c rune, size int) bool {
	switch {
	case c == utf8.RuneError && size == 1:
		return false
	case c == '\t' || c == '\n' || c == '\r' || (c >= 0x20 && c <= 0x7e):
		return true
	case c == 0x85 || c == 0x2028 || c == 0x2029:
		return false // line breaks to YAML (NEL, LS, PS): outside the subset
	case (c >= 0xa0 && c <= 0xd7ff) || (c >= 0xe000 && c <= 0xfffd && c != 0xfeff) || c >= 0x10000:
		return true
	}
	return false
}

// nextLine moves to the next line that holds content (not blank, not only
// a comment), with col at its first byte; false at the end of the file.
func (r *subsetReader) nextLine() bool {
	for r.row++; r.row < len(r.lines); r.row++ {
		l := r.lines[r.row]
		i := 0
		for i < len(l) && l[i] == ' ' {
			i++
		}
		if i < len(l) && l[i] == '\t' {
			r.col = i
			r.unsupported("tabs at the start of a line are not supported", "indent with spaces")
		}
		if i < len(l) && l[i] != '#' {
			r.col = i
			return true
		}
	}
	r.col = 0
	return false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// blockNode reads the node that starts at the current line and position,
// indented more than parent (a block sequence under a key may sit at the
// key's own indentation: the caller passes parent-1 for it).
func (r *subsetReader) blockNode(parent int) *node {
	l := r.lines[r.row]
	switch {
	case l[r.col] == '-' && (r.col+1 == len(l) || l[r.col+1] == ' '):
		return r.blockSequence()
	case r.isKeyLine():
		return r.blockMapping()
	}
	n := r.inlineValue(false)
	r.nextLine()
	return n
}

// isKeyLine reports whether the current line, from col, is "key: ...".
func (r *subsetReader) isKeyLine() bool {
	l := r.lines[r.row][r.col:]
	switch l[0] {
	case '"', '\'':
		end := quotedEnd(l)
		if end < 0 {
			return false
		}
		rest := trimSpace(l[end:])
		return len(rest) > 0 && rest[0] == ':' && (len(rest) == 1 || rest[1] == ' ' || rest[1] == '\t')
	case '{', '[':
		return false
	}
	_, ok := plainKeyEnd(l)
	return ok
}

// plainKeyEnd returns where a plain key ends (its ':'), when l starts with
// "key:" followed by a space or the line's end, before any comment.
func plainKeyEnd(l []byte) (int, bool) {
	for i := 0; i < len(l); i++ {
		switch {
		case l[i] == '#' && i > 0 && (l[i-1] == ' ' || l[i-1] == '\t'):
			return 0, false
		case l[i] == ':' && (i+1 == len(l) || l[i+1] == ' ' || l[i+1] == '\t'):
			return i, true
		}
	}
	return 0, false
}

// quotedEnd returns the index just past the closing quote of the quoted
// scalar l starts with, -1 when it does not close on this line.
func quotedEnd(l []byte) int {
	q := l[0]
	for i := 1; i < len(l); i++ {
		switch {
		case q == '\'' && l[i] == '\'':
			if i+1 < len(l) && l[i+1] == '\'' {
				i++
				continue
			}
			return i + 1
		case q == '"' && l[i] == '\\':
			i++
		case q == '"' && l[i] == '"':
			return i + 1
		}
	}
	return -1
}

func (r *subsetReader) blockMapping() *node {
	indent := r.col
	m := &node{kind: mappingNode, tag: "!!map", line: r.row + 1}
	last := ""
	for r.row < len(r.lines) && r.col == indent && r.isKeyLine() {
		k := r.key()
		last = keyName(k)
		r.path = append(r.path, last)
		m.content = append(m.content, k, r.blockValue(indent))
		r.path = r.path[:len(r.path)-1]
	}
	if r.row < len(r.lines) && r.col > indent {
		if last != "" {
			r.path = append(r.path, last) // "name: a\n  b": the value of name goes on
		}
		r.fail("unexpected content at indentation " + itoa(r.col) + " (a key at indentation " + itoa(indent) +
			" ended above: check the indentation; a value over several lines is not supported: write it on one line)")
	}
	return m
}

func keyName(k *node) string {
	if k.value == "" {
		return `""`
	}
	return k.value
}

// key reads "key:" at the current position and leaves col after the ':'.
func (r *subsetReader) key() *node {
	l := r.lines[r.row]
	var k *node
	if c := l[r.col]; c == '"' || c == '\'' {
		k = r.quoted()
		for r.col < len(l) && l[r.col] == ' ' {
			r.col++
		}
	} else {
		r.checkPlainStart()
		end, _ := plainKeyEnd(l[r.col:])
		k = r.plain(string(trimSpace(l[r.col : r.col+end])))
		r.col += end
	}
	if r.col >= len(l) || l[r.col] != ':' {
		r.fail("expected ':' after the key")
	}
	r.col++
	return r.checkKey(k)
}

// checkKey refuses keys of more than 1,000 bytes: YAML limits an implicit
// key to 1,024 characters.
func (r *subsetReader) checkKey(k *node) *node {
	if len(k.value) > 1000 {
		r.fail("a key longer than 1000 bytes")
	}
	return k
}

// blockValue reads the value after "key:": on the same line, or the block
// below it (more indented, or a sequence at the key's indentation), or
// nothing (null).
func (r *subsetReader) blockValue(indent int) *node {
	l := r.lines[r.row]
	rest := trimSpace(l[r.col:])
	if len(rest) > 0 && rest[0] != '#' {
		for l[r.col] == ' ' || l[r.col] == '\t' {
			r.col++
		}
		n := r.inlineValue(false)
		r.nextLine()
		return n
	}
	keyRow := r.row
	if !r.nextLine() {
		return &node{kind: scalarNode, tag: "!!null", line: keyRow + 1}
	}
	l = r.lines[r.row]
	isSeq := l[r.col] == '-' && (r.col+1 == len(l) || l[r.col+1] == ' ')
	if r.col > indent || (r.col == indent && isSeq) {
		if !isSeq {
			r.checkPlainStart() // an anchor, alias or tag on a line of its own
		}
		if !isSeq && !r.isKeyLine() {
			r.unsupported("a value on the line below its key is not supported", "write it on the key's line (key: value)")
		}
		return r.blockNode(indent)
	}
	return &node{kind: scalarNode, tag: "!!null", line: keyRow + 1}
}

func (r *subsetReader) blockSequence() *node {
	indent := r.col
	s := &node{kind: sequenceNode, tag: "!!seq", line: r.row + 1}
	for i := 0; r.row < len(r.lines) && r.col == indent; i++ {
		l := r.lines[r.row]
		if l[r.col] != '-' || (r.col+1 < len(l) && l[r.col+1] != ' ') {
			break
		}
		r.path = append(r.path, "["+itoa(i)+"]")
		r.col++
		rest := trimSpace(l[r.col:])
		if len(rest) == 0 || rest[0] == '#' {
			r.unsupported("a list item on the line below its '-' is not supported", "write it on the '-' line")
		}
		for l[r.col] == ' ' {
			r.col++
		}
		if l[r.col] == '-' && (r.col+1 == len(l) || l[r.col+1] == ' ') {
			r.unsupported("a list inside a block list item is not supported", "write the items one per '-' line, or the list as [a, b]")
		}
		r.checkPlainStart() // an anchor, alias or tag first: "- &a {b: 1}" is an anchor, not an object
		if r.isKeyLine() {
			r.unsupported("an object inside a block list item is not supported", "write it as - {key: value}")
		}
		s.content = append(s.content, r.inlineValue(false))
		r.path = r.path[:len(r.path)-1]
		r.nextLine()
	}
	if r.row < len(r.lines) && r.col > indent {
		r.fail("unexpected content at indentation " + itoa(r.col) + " (a list at indentation " + itoa(indent) +
			" ended above: check the indentation; a value over several lines is not supported: write it on one line)")
	}
	// The path keeps the last item's index for errors past the list's end.
	return s
}

// inlineValue reads one value that starts at the current position: a flow
// collection (which may go on over lines), a quoted or a plain scalar. In
// block context the rest of the line must then be empty or a comment.
func (r *subsetReader) inlineValue(flow bool) *node {
	l := r.lines[r.row]
	var n *node
	switch c := l[r.col]; c {
	case '{', '[':
		n = r.flowCollection(0)
	case '"', '\'':
		n = r.quoted()
	default:
		r.checkPlainStart()
		end := len(l)
		for i := r.col; i < len(l); i++ {
			if l[i] == '#' && (l[i-1] == ' ' || l[i-1] == '\t') {
				end = i
				break
			}
			if l[i] == ':' && (i+1 == len(l) || l[i+1] == ' ' || l[i+1] == '\t') {
				r.col = i
				r.fail("a ': ' inside a value (quote the value, or put a nested object on the lines below its key)")
			}
		}
		text := trimSpace(l[r.col:end])
		n = r.plain(string(text))
		r.col += len(text)
	}
	l = r.lines[r.row] // a flow collection may end on a later line
	if rest := trimLeft(l[r.col:]); len(rest) > 0 {
		at := len(l) - len(rest)
		if rest[0] != '#' || at == r.col {
			r.col = at
			r.fail("unexpected " + strconv.Quote(string(trimSpace(rest))) + " after the value")
		}
	}
	return n
}

// indicatorWord returns the anchor, alias or tag l starts with ("&base",
// "!!str"), up to a space or a flow indicator, at most 40 bytes.
func indicatorWord(l []byte) string {
	end := 1
	for end < len(l) && end < 40 && !strings.ContainsRune(" \t,[]{}", rune(l[end])) {
		end++
	}
	return strconv.Quote(string(l[:end]))
}

// checkPlainStart rejects the YAML features that start with an indicator.
func (r *subsetReader) checkPlainStart() {
	l := r.lines[r.row][r.col:]
	switch l[0] {
	case '&':
		r.unsupported("anchors and aliases are not supported (found the anchor "+indicatorWord(l)+")",
			"write the value out in each place it is used")
	case '*':
		r.unsupported("anchors and aliases are not supported (found the alias "+indicatorWord(l)+")",
			"write out the value it stands for")
	case '!':
		r.unsupported("tags are not supported (found the tag "+indicatorWord(l)+")",
			"remove the tag; quote the value to make it a string")
	case '|', '>':
		r.unsupported("block scalars (| and >) are not supported", "write the value on the key's line, quoted if need be")
	case '?':
		r.unsupported("complex keys (?) are not supported", "write the key as key: value")
	case '%', '@', '`', ',', ']', '}', ':', '#':
		r.fail("a value must not start with " + strconv.Quote(string(l[:1])) + " (quote it)")
	case '-':
		if len(l) == 1 || l[1] == ' ' || l[1] == '\t' {
			r.fail("a '-' list item where a value was expected")
		}
	}
}

// plain makes a plain scalar node and resolves its tag as YAML 1.2's core
// schema does in go.yaml.in/yaml/v3.
func (r *subsetReader) plain(s string) *node {
	tag := plainTag(s)
	if tag == "" {
		r.unsupported("a value that reads as a date or timestamp ("+strconv.Quote(s)+") is not supported", "quote it to make it a string")
	}
	return &node{kind: scalarNode, tag: tag, value: s, line: r.row + 1}
}

// plainTag is go.yaml.in/yaml/v3's resolve for an untagged plain scalar,
// "" for the timestamps it would parse with time.Parse (outside the
// subset: time's layout parser is part of what the module leaves out).
func plainTag(s string) string {
	switch s {
	case "true", "True", "TRUE", "false", "False", "FALSE":
		return "!!bool"
	case "", "~", "null", "Null", "NULL":
		return "!!null"
	case ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF":
		return "!!float"
	case "<<":
		return "!!merge"
	}
	switch c := s[0]; {
	case c == '.':
		if _, err := strconv.ParseFloat(s, 64); err == nil {
			return "!!float"
		}
	case c == '+' || c == '-' || (c >= '0' && c <= '9'):
		if c != '+' && c != '-' && timestampLike(s) {
			return ""
		}
		plain := strings.ReplaceAll(s, "_", "")
		if _, err := strconv.ParseInt(plain, 0, 64); err == nil {
			return "!!int"
		}
		if _, err := strconv.ParseUint(plain, 0, 64); err == nil {
			return "!!int"
		}
		if yamlFloat(plain) {
			if _, err := strconv.ParseFloat(plain, 64); err == nil {
				return "!!float"
			}
		}
		for _, p := range []string{"0b", "-0b", "0o", "-0o"} {
			if digits, ok := strings.CutPrefix(plain, p); ok {
				base := 2
				if p[len(p)-1] == 'o' {
					base = 8
				}
				if p[0] == '-' {
					digits = "-" + digits
				}
				if _, err := strconv.ParseInt(digits, base, 64); err == nil {
					return "!!int"
				}
				if _, err := strconv.ParseUint(digits, base, 64); err == nil && p[0] != '-' {
					return "!!int"
				}
			}
		}
	}
	return "!!str"
}

// timestampLike reports the plain scalars yaml/v3 tries as timestamps:
// four digits and a '-'.
func timestampLike(s string) bool {
	return len(s) > 4 && isDigits(s[:4]) && s[4] == '-'
}

// yamlFloat matches ^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$.
func yamlFloat(s string) bool {
	if s != "" && (s[0] == '-' || s[0] == '+') {
		s = s[1:]
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		if len(s) < 2 || s[0] != '.' || s[1] < '0' || s[1] > '9' {
			return false
		}
		for i = 1; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		}
	} else if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '-' || s[i] == '+') {
			i++
		}
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == j {
			return false
		}
	}
	return i == len(s)
}

// quoted reads a 'single' or "double" quoted scalar that ends on its line.
func (r *subsetReader) quoted() *node {
	l := r.lines[r.row]
	end := quotedEnd(l[r.col:])
	if end < 0 {
		r.unsupported("a quoted value over several lines is not supported", "close the quote on the line it opens on")
	}
	body := string(l[r.col+1 : r.col+end-1])
	n := &node{kind: scalarNode, tag: "!!str", line: r.row + 1}
	if l[r.col] == '\'' {
		n.value = strings.ReplaceAll(body, "''", "'")
	} else {
		n.value = r.unescape(body)
	}
	r.col += end
	return n
}

// unescape decodes the escapes of a double-quoted scalar (YAML 1.2's, a
// superset of JSON's).
func (r *subsetReader) unescape(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		i++
		if i == len(s) {
			r.fail("a '\\' at the end of a quoted value")
		}
		simple := map[byte]string{'0': "\x00", 'a': "\a", 'b': "\b", 't': "\t", '\t': "\t", 'n': "\n", 'v': "\v",
			'f': "\f", 'r': "\r", 'e': "\x1b", ' ': " ", '"': "\"", '\\': "\\", // not JSON's \/: yaml/v3 refuses it
			'N': "\u0085", '_': "\u00a0", 'L': "\u2028", 'P': "\u2029"}
		if v, ok := simple[s[i]]; ok {
			b.WriteString(v)
			continue
		}
		width := map[byte]int{'x': 2, 'u': 4, 'U': 8}[s[i]]
		if width == 0 {
			r.fail("unknown escape " + strconv.Quote(s[i-1:i+1]) + " in a quoted value")
		}
		if i+width >= len(s) {
			r.fail("a short escape " + strconv.Quote(s[i-1:]) + " in a quoted value")
		}
		v, err := strconv.ParseUint(s[i+1:i+1+width], 16, 32)
		if err != nil || (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff {
			r.fail("an invalid escape " + strconv.Quote(s[i-1:i+1+width]) + " in a quoted value")
		}
		b.WriteRune(rune(v))
		i += width
	}
	return b.String()
}

// flowCollection reads a {...} object or a [...] list (JSON's syntax, with
// YAML's plain scalars), which may go on over lines.
func (r *subsetReader) flowCollection(depth int) *node {
	if depth >= 64 {
		r.fail("objects and lists nested more than 64 deep")
	}
	n := &node{kind: mappingNode, tag: "!!map", line: r.row + 1}
	closer := byte('}')
	if r.lines[r.row][r.col] == '[' {
		n.kind, n.tag, closer = sequenceNode, "!!seq", ']'
	}
	r.col++
	if r.flowSpace() == closer {
		r.col++
		return n
	}
	for i := 0; ; i++ {
		if closer == '}' {
			k := r.checkKey(r.flowItem(depth, true))
			keyRow := r.row
			c := r.flowSpace()
			if c == ':' && r.row != keyRow {
				r.unsupported("a key and its ':' on different lines are not supported", "write the ':' right after the key")
			}
			if c != ':' && c != ',' && c != '}' {
				r.fail("expected ':' after the key " + strconv.Quote(k.value))
			}
			if c == ':' { // "{a, b: 1}": a key alone has a null value
				r.col++
				c = r.flowSpace()
			}
			r.path = append(r.path, keyName(k))
			var v *node
			if c == ',' || c == '}' {
				v = &node{kind: scalarNode, tag: "!!null", line: r.row + 1}
			} else {
				v = r.flowItem(depth, false)
			}
			r.path = r.path[:len(r.path)-1]
			n.content = append(n.content, k, v)
		} else {
			r.path = append(r.path, "["+itoa(i)+"]")
			v := r.flowItem(depth, false)
			if r.flowSpace() == ':' {
				r.unsupported("a key: value pair in a [...] list is not supported", "write it as {key: value}")
			}
			r.path = r.path[:len(r.path)-1]
			n.content = append(n.content, v)
		}
		switch r.flowSpace() {
		case ',':
			r.col++
			if r.flowSpace() == closer {
				r.unsupported("a trailing comma is not supported", "remove the last ','")
			}
		case closer:
			r.col++
			return n
		default:
			r.fail("expected ',' or '" + string(closer) + "'")
		}
	}
}

// flowSpace skips spaces, tabs, comments and line breaks inside a flow
// collection and returns the byte it stops at.
func (r *subsetReader) flowSpace() byte {
	for r.row < len(r.lines) {
		l := r.lines[r.row]
		for r.col < len(l) && (l[r.col] == ' ' || l[r.col] == '\t') {
			r.col++
		}
		if r.col < len(l) && !(l[r.col] == '#' && (r.col == 0 || l[r.col-1] == ' ' || l[r.col-1] == '\t')) {
			return l[r.col]
		}
		r.row, r.col = r.row+1, 0
	}
	r.row = len(r.lines) - 1
	r.col = len(r.lines[r.row])
	r.fail("a { or [ that is never closed")
	return 0
}

// flowItem reads a key or a value inside a flow collection.
func (r *subsetReader) flowItem(depth int, key bool) *node {
	l := r.lines[r.row]
	switch l[r.col] {
	case '{', '[':
		if key {
			r.unsupported("an object or a list as a key is not supported", "keys must be strings")
		}
		return r.flowCollection(depth + 1)
	case '"', '\'':
		return r.quoted()
	}
	r.checkPlainStart()
	start, end := r.col, r.col
	for ; end < len(l); end++ {
		c := l[end]
		if c == ',' || c == '[' || c == ']' || c == '{' || c == '}' || c == '?' || (c == '#' && (l[end-1] == ' ' || l[end-1] == '\t')) {
			break
		}
		if c == ':' {
			if end+1 < len(l) && l[end+1] != ' ' && l[end+1] != '\t' {
				r.col = end
				r.fail("a ':' inside a value (quote the value)")
			}
			break
		}
	}
	r.col = end
	return r.plain(string(trimSpace(l[start:end])))
}
