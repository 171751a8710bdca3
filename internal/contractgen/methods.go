package main

import (
	"fmt"
	"regexp"
	"strings"
)

// Method marks an export every host wraps as a public method of its
// Policy: a call with the policy's handle and one i64 (the export's last
// parameter, now_ms or a duration in ms), or now_ms and then that i64
// (record_duration), whose result is the answer. The templates write the
// method, its doc and its conversion from this, so a host has no hand copy
// of it.
type Method struct {
	// Answer is what the result is: "none" (nothing), "ms" (a duration
	// in ms), or the enum or word it holds.
	Answer string `json:"answer"`
	// Stateless is the answer of a stateless policy (no budget, no
	// breaker), which a host may give without a call; nil when it calls.
	Stateless *int64 `json:"stateless,omitempty"`
	// Doc says what the method does. {name} refers to another method by
	// its export's name; each language writes it its own way.
	Doc string `json:"doc"`
	// Invalid says when the argument is an invalid input (the module's
	// message), as "for an argument that is ...".
	Invalid string `json:"invalid,omitempty"`
	// Stops is a result after which the answer never changes for the
	// policy: the host stops calling, and answers from then on as for a
	// stateless policy (record_duration's 1: the policy has no slow-call
	// rate, and never will). Only with Stateless.
	Stops *int64 `json:"stops,omitempty"`
}

// Methods are the exports with a Method of one argument, (h, x), in the
// schema's order.
func (s *Schema) Methods() []Export { return s.methods(false) }

// NowMethods are the exports with a Method of two, (h, now_ms, x), in the
// schema's order: x is the argument (Arg), and now_ms, when the call
// ended, defaults to the host's clock. A host's public method takes x
// first and now_ms last (optional) where its language has defaults (Node,
// Python), in the export's order otherwise (Java). Hosts converted x
// first, and now_ms only when they call the module; a stateless policy
// (or a stopped one) answers without reading now_ms.
func (s *Schema) NowMethods() []Export { return s.methods(true) }

func (s *Schema) methods(now bool) []Export {
	var out []Export
	for _, e := range s.Exports {
		if e.Method != nil && e.TakesNow() == now {
			out = append(out, e)
		}
	}
	return out
}

// Arg is a method's argument: the export's last parameter.
func (e Export) Arg() string { return e.Params[len(e.Params)-1].Name }

// TakesNow reports whether a method takes now_ms before its argument.
func (e Export) TakesNow() bool { return len(e.Params) == 3 && e.Params[1].Name == "now_ms" }

// Kind is how a host converts a method's answer: none, ms, enum, word,
// or optional (a word of an amount in thousandths and whether there is
// one: the budget).
func (s *Schema) Kind(m *Method) string {
	switch {
	case m.Answer == "none" || m.Answer == "ms":
		return m.Answer
	case s.isEnum(m.Answer):
		return "enum"
	}
	w := s.Word(m.Answer)
	if w.Go != "" {
		return "word"
	}
	names := ""
	for _, f := range w.Fields {
		names += " " + f.Name
	}
	if names != " milli present" {
		panic("contractgen: the word " + w.Name + " has no type (go), and is not an amount in thousandths (milli) and whether there is one (present): no host type for it")
	}
	return "optional"
}

func (s *Schema) checkMethods() error {
	for _, e := range append(s.Methods(), s.NowMethods()...) {
		shape := len(e.Params) == 2 || (e.TakesNow() && e.Params[1].Type == "i64" && e.Arg() != "now_ms")
		if !shape || e.Params[0].Name != "h" || e.Params[len(e.Params)-1].Type != "i64" {
			return fmt.Errorf("exports: %s: a method takes (h i32, x i64) or (h i32, now_ms i64, x i64)", e.Name)
		}
		m := e.Method
		if m.Stops != nil && m.Stateless == nil {
			return fmt.Errorf("exports: %s: a method that stops (stops) needs the stateless answer it gives then", e.Name)
		}
		if m.Answer != "none" && m.Answer != "ms" && !s.isEnum(m.Answer) && !s.isWord(m.Answer) {
			return fmt.Errorf("exports: %s: unknown answer %q", e.Name, m.Answer)
		}
	}
	return nil
}

func (s *Schema) isEnum(name string) bool {
	for _, e := range s.Enums {
		if e.Name == name {
			return true
		}
	}
	return false
}

func (s *Schema) isWord(name string) bool {
	for _, w := range s.Words {
		if w.Name == name {
			return true
		}
	}
	return false
}

var methodRef = regexp.MustCompile(`\{([a-z_]+)\}`)

// docIn is a method's doc (a sentence) for one language: each {name} as
// ref(name), each snake_case parameter name as param(name).
func docIn(e Export, doc string, ref, param func(string) string) string {
	doc = methodRef.ReplaceAllStringFunc(sentence(doc), func(m string) string { return ref(m[1 : len(m)-1]) })
	if e.TakesNow() {
		doc = strings.ReplaceAll(doc, "now_ms", param("now_ms"))
	}
	return strings.ReplaceAll(doc, e.Arg(), param(e.Arg()))
}

// wrap breaks s into lines of at most width characters (a longer word
// stays whole), each after the first prefixed with indent.
func wrap(indent string, width int, s string) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		switch {
		case i == 0:
		case n+1+len(w) > width:
			b.WriteString("\n" + indent)
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}

func init() {
	funcs["wrap"] = wrap
	funcs["pyDoc"] = func(e Export, doc string) string {
		return docIn(e, doc, func(n string) string { return "``" + n + "``" }, func(n string) string { return "``" + n + "``" })
	}
	funcs["javaDoc"] = func(e Export, doc string) string {
		return docIn(e, doc, func(n string) string { return "{@code " + camel(n) + "}" }, func(n string) string { return "{@code " + camel(n) + "}" })
	}
}

// pyAnswer is the Python expression of a method's answer r (an
// expression of the export's result).
func pyAnswer(s *Schema, m *Method, r string) string {
	switch s.Kind(m) {
	case "none", "ms":
		return r
	case "enum":
		return strings.ToUpper(m.Answer) + "_NAMES[" + r + "]"
	case "optional":
		return "_thousandths(" + m.Answer + "(" + r + "))"
	}
	return m.Answer + "(" + r + ")"
}

// javaAnswer is the Java statement that returns a method's answer from
// the export's result r.
func javaAnswer(s *Schema, m *Method, r string) string {
	switch s.Kind(m) {
	case "none":
		return r + ";"
	case "ms":
		return "return " + r + ";"
	case "enum":
		return "return " + javaEnums[m.Answer] + ".of(" + r + ");"
	case "optional":
		c := camel(m.Answer)
		return "long w = " + r + ";\n    return Contract." + c + "Present(w) ? OptionalDouble.of(Contract." + c +
			"Milli(w) / 1000.0) : OptionalDouble.empty();"
	}
	return "return " + s.Word(m.Answer).Go + ".unpack(" + r + ");"
}

func init() {
	funcs["pyAnswer"] = pyAnswer
	funcs["javaAnswer"] = javaAnswer
	funcs["choose"] = func(c bool, a, b string) string {
		if c {
			return a
		}
		return b
	}
	funcs["deref"] = func(p *int64) int64 { return *p }
	funcs["kind"] = func(s *Schema, m *Method) string { return s.Kind(m) }
	// pyType and javaType are the types of a method's answer.
	funcs["pyAnswerType"] = func(s *Schema, m *Method) string {
		return map[string]string{"none": "None", "ms": "int", "enum": "str", "optional": "Optional[float]", "word": s.wordGo(m.Answer)}[s.Kind(m)]
	}
	funcs["javaAnswerType"] = func(s *Schema, m *Method) string {
		return map[string]string{"none": "void", "ms": "long", "enum": javaEnums[m.Answer], "optional": "OptionalDouble", "word": s.wordGo(m.Answer)}[s.Kind(m)]
	}
}

func (s *Schema) wordGo(name string) string {
	if s.isWord(name) {
		return s.Word(name).Go
	}
	return ""
}

// nodeAnswer is the JavaScript expression of a method's answer r (an
// expression of the export's result: a Number for an i32, a BigInt for
// an i64).
func nodeAnswer(s *Schema, m *Method, r string) string {
	switch s.Kind(m) {
	case "none":
		return r
	case "ms":
		return "Number(" + r + ")"
	case "enum":
		return strings.ToUpper(m.Answer) + "_NAMES[Number(" + r + ")]"
	case "optional":
		return "thousandths(unpack" + pascal(m.Answer) + "(...halves(" + r + ")))"
	}
	return "unpack" + pascal(m.Answer) + "(...halves(" + r + "))"
}

func init() {
	funcs["nodeAnswer"] = nodeAnswer
	funcs["nodeAnswerType"] = func(s *Schema, m *Method) string {
		return map[string]string{"none": "void", "ms": "number", "enum": pascal(m.Answer), "optional": "number | null", "word": s.wordGo(m.Answer)}[s.Kind(m)]
	}
	funcs["nodeDoc"] = func(e Export, doc string) string {
		return docIn(e, doc, func(n string) string { return "`" + camel(n) + "`" }, func(n string) string { return "`" + camel(n) + "`" })
	}
}
