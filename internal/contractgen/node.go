package main

import "strings"

// The Node templates' helpers.
func init() {
	// nodeName is a failure field's name in the vectors and the Node API's
	// snake_case spelling.
	funcs["nodeName"] = jwire
	// nodeTypes lists the failure's field types, each once, in field order:
	// the converters the Node encoder's generated code calls.
	funcs["nodeTypes"] = func(s *Schema) []string {
		var out []string
		seen := map[string]bool{}
		for _, f := range s.Failure {
			if !seen[f.Type] {
				seen[f.Type] = true
				out = append(out, f.Type)
			}
		}
		return out
	}
	funcs["hasSuffix"] = strings.HasSuffix
	// nodeDefault is the JavaScript value of a field the host fills when it
	// is absent (the clock, a draw), or "".
	funcs["nodeDefault"] = func(f Field) string {
		return map[string]string{"clock": "Date.now()", "draw": "Math.random()"}[jclock(f)]
	}
}
