package main

import "strings"

// The Node templates' helpers.
func init() {
	// nodeName is a failure field's name in the vectors and the Node API's
	// snake_case spelling.
	funcs["nodeName"] = jwire
	// recordOffset is the byte offset of the record field named name.
	funcs["recordOffset"] = func(s *Schema, name string) int {
		for _, f := range s.Record.Fields {
			if f.Name == name {
				return f.Offset
			}
		}
		panic("contractgen: no record field " + name)
	}
	// export is the export named name.
	funcs["export"] = func(s *Schema, name string) Export {
		for _, e := range s.Exports {
			if e.Name == name {
				return e
			}
		}
		panic("contractgen: no export " + name)
	}
	funcs["div"] = func(a, b int) int { return a / b }
	funcs["hasSuffix"] = strings.HasSuffix
	// nodeDefault is the JavaScript value of a field the host fills when it
	// is absent (the clock, a draw), or "".
	funcs["nodeDefault"] = func(f Field) string {
		return map[string]string{"clock": "Date.now()", "draw": "Math.random()"}[jclock(f)]
	}
}
