package main

import (
	"fmt"
	"strings"
)

// Fact is what a host's Policy reads from the module once, when it is
// loaded: an export of the policy's handle alone whose answer never
// changes for that policy. The templates write the reading, and with a
// Doc the public accessor, so a host has no hand copy of either.
type Fact struct {
	Export string `json:"export"`
	// Name is the host's name for it (snake_case; each language spells it).
	Name string `json:"name"`
	// Answer is what the result is: "bool" (1 true), "ms" (a duration in
	// ms, 0 none), "lints" (the lints table's bits) or an enum's name.
	Answer string `json:"answer"`
	// Doc, when set, says what the accessor every host generates answers;
	// without it the host writes the accessor itself (a language's own
	// units or wording) over the value read.
	Doc string `json:"doc,omitempty"`
}

func (s *Schema) checkFacts() error {
	for _, f := range s.Facts {
		e := s.exportNamed(f.Export)
		if e == nil || len(e.Params) != 1 || e.Params[0].Name != "h" {
			return fmt.Errorf("facts: %s: export %q is not one of the policy's handle alone", f.Name, f.Export)
		}
		if f.Answer != "bool" && f.Answer != "ms" && f.Answer != "lints" && !s.isEnum(f.Answer) {
			return fmt.Errorf("facts: %s: unknown answer %q", f.Name, f.Answer)
		}
	}
	return nil
}

func (s *Schema) exportNamed(name string) *Export {
	for i := range s.Exports {
		if s.Exports[i].Name == name {
			return &s.Exports[i]
		}
	}
	return nil
}

// factIn is a fact's value in one language, from r (an expression of the
// export's result), given the language's spelling of the enums and lints.
func factIn(f Fact, r string, enum, lints func(string) string) string {
	switch f.Answer {
	case "bool":
		return r + " == 1"
	case "ms":
		return r
	case "lints":
		return lints(r)
	}
	return enum(r)
}

func init() {
	named := func(f Fact, names string) func(string) string {
		return func(r string) string { return strings.ToUpper(f.Answer) + names + "[" + r + "]" }
	}
	funcs["pyFact"] = func(f Fact) string {
		return factIn(f, `call("`+f.Export+`")`, named(f, "_NAMES"), func(r string) string { return "lints_of(" + r + ")" })
	}
	funcs["pyFactType"] = func(f Fact) string {
		if t, ok := map[string]string{"bool": "bool", "ms": "int", "lints": "Tuple[Lint, ...]"}[f.Answer]; ok {
			return t
		}
		return "str"
	}
	// pyFactAttr, javaFactField: where a Policy keeps a fact (a duration says ms).
	funcs["pyFactAttr"] = func(f Fact) string { return "_" + f.Name + map[bool]string{true: "_ms"}[f.Answer == "ms"] }
	funcs["javaFactField"] = func(f Fact) string { return camel(f.Name) + map[bool]string{true: "Ms"}[f.Answer == "ms"] }
	funcs["javaFact"] = func(f Fact) string {
		return factIn(f, `call.applyAsLong("`+f.Export+`")`, func(r string) string { return javaEnums[f.Answer] + ".of(" + r + ")" },
			func(r string) string { return "Lint.of(" + r + ")" })
	}
	funcs["javaFactType"] = func(f Fact) string {
		if t, ok := map[string]string{"bool": "boolean", "ms": "long", "lints": "List<Lint>"}[f.Answer]; ok {
			return t
		}
		return javaEnums[f.Answer]
	}
	funcs["nodeFact"] = func(f Fact) string {
		r := "call('" + f.Export + "')"
		if f.Answer == "ms" {
			r = "Number(" + r + ")" // an i64: a BigInt
		}
		return strings.Replace(factIn(f, r, named(f, "_NAMES"), func(r string) string { return "lintsOf(" + r + ")" }), " == 1", " === 1", 1)
	}
	funcs["nodeFactType"] = func(f Fact) string {
		if t, ok := map[string]string{"bool": "boolean", "ms": "number", "lints": "readonly Lint[]"}[f.Answer]; ok {
			return t
		}
		return pascal(f.Answer)
	}
}
