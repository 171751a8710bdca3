package main

import (
	"fmt"
	"strings"
)

// The Java bindings' helpers (templates java_*.tmpl): where each enum
// lives in the Java API, and how a failure field or a word field is
// written in Java.

// javaEnums are the Java types of the schema's enums: the decision's
// nested in Decision, the outcome's in Outcome, the rest top-level.
var javaEnums = map[string]string{
	"action": "Decision.Action", "class": "Decision.FailureClass", "reason": "Decision.Reason",
	"circuit_state": "CircuitState", "on_open": "OnOpen",
	"event": "Outcome.Event", "outcome_action": "Outcome.Action", "count": "Outcome.Count",
}

func init() {
	funcs["javaEnum"] = func(name string) string {
		t, ok := javaEnums[name]
		if !ok {
			panic("contractgen: no Java type for enum " + name + " (java.go, javaEnums)")
		}
		return t
	}
	// jsimple is a Java type's simple name (Decision.Reason: Reason).
	funcs["javaSimple"] = func(t string) string { return t[strings.LastIndex(t, ".")+1:] }
	funcs["javaWire"] = jwire
	funcs["javaName"] = func(f Field) string { return camel(jwire(f)) }
	funcs["javaType"] = jtype
	funcs["javaClock"] = jclock
	funcs["javaComp"] = jcomp
	funcs["javaOrder"] = jorder
	funcs["javaUnpack"] = junpack
	funcs["javaCtx"] = func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	funcs["javaWtype"] = func(f WordField) string {
		switch {
		case f.Bool:
			return "boolean"
		case f.Enum != "":
			return javaEnums[f.Enum]
		}
		return "long"
	}
	// jbefore are the fields before f that share its string slot: f fills
	// the slot only when they are empty.
	funcs["javaBefore"] = func(s *Schema, f Field) []Field {
		var out []Field
		for _, g := range s.Failure {
			if g.Name == f.Name {
				break
			}
			if f.String != "" && g.String == f.String {
				out = append(out, g)
			}
		}
		return out
	}
	// jtrunc: an int64 field in milliseconds drops a fraction; attempt
	// (a count) refuses one (testdata/vectors/README.md, "Field values").
	funcs["javaFail"] = func(msg string) (string, error) { return "", fmt.Errorf("java: %s", msg) }
	funcs["javaSlot"] = func(s *Schema, slot string) []Field {
		var out []Field
		for _, f := range s.Failure {
			if f.String == slot {
				out = append(out, f)
			}
		}
		return out
	}
}

// jwire is a failure field's name in the vectors' input and every SDK's
// API (the vectors' snake_case).
func jwire(f Field) string { return f.InputName() }

// jclock is the Java default of a field a host fills when it is unset
// ("clock" for now_ms, "draw" for random), or "".
func jclock(f Field) string {
	switch {
	case f.Type == "random":
		return "draw"
	case f.Name == "now_ms":
		return "clock"
	}
	return ""
}

// jtype is the Java type a Failure keeps a field in: strings as their
// UTF-8 bytes, the key as whether there is one, a field the host fills
// when unset boxed (null: unset).
func jtype(f Field) string {
	switch f.Type {
	case "int64":
		if jclock(f) != "" {
			return "Long"
		}
		return "long"
	case "int32", "grpc_code":
		return "int"
	case "string", "hint":
		return "byte[]"
	case "key", "bool":
		return "boolean"
	case "random":
		return "Double"
	}
	panic("contractgen: no Java type for " + f.Type)
}

// jcomp is a word field's name as a Java record component (class is a
// keyword: failureClass).
func jcomp(f WordField) string {
	if f.Name == "class" {
		return "failureClass"
	}
	return camel(f.Name)
}

// jorder is the word's fields in the order of the Java record's
// components (names, space-separated), which the public API fixed.
func jorder(w *Word, names string) []WordField {
	var out []WordField
	for _, n := range strings.Fields(names) {
		found := false
		for _, f := range w.Fields {
			if f.Name == n {
				out, found = append(out, f), true
			}
		}
		if !found {
			panic("contractgen: word " + w.Name + " has no field " + n)
		}
	}
	if len(out) != len(w.Fields) {
		panic("contractgen: the Java record of word " + w.Name + " leaves out some of its fields")
	}
	return out
}

// junpack is the Java expression of a word field's value in the word w.
func junpack(f WordField) string {
	bits := "w"
	if f.Lo > 0 {
		bits = fmt.Sprintf("w >>> %d", f.Lo)
	}
	switch {
	case f.Bool:
		return fmt.Sprintf("(%s & 1) != 0", bits)
	case f.Enum != "":
		return fmt.Sprintf("%s.of(%s & %#x)", javaEnums[f.Enum], bits, f.Mask())
	}
	return fmt.Sprintf("%s & %#xL", bits, f.Mask())
}
