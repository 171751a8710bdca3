package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Schema is contract/abi.json, the one source of the ABI and of the
// failure, decision and outcome shapes; the templates render it.
type Schema struct {
	Version int        `json:"version"`
	Limits  []Limit    `json:"limits"`
	Errors  []ErrCode  `json:"errors"`
	Types   []Type     `json:"types"`
	Failure []Field    `json:"failure"`
	Flags   []Flag     `json:"flags"`
	Strings []Named    `json:"strings"`
	Record  Record     `json:"record"`
	Values  []ValueTag `json:"values"`
	Enums   []*Enum    `json:"enums"`
	Words   []*Word    `json:"words"`
	Presets []Named    `json:"presets"` // policy.PresetNames, sorted (a test compares)
	Facts   []Fact     `json:"facts"`
	Lints   []Lint     `json:"lints"`
	Exports []Export   `json:"exports"`
}

// Lint is one warning about a valid policy (policy/lint.go decides when it
// fires). The module reports a policy's lints as bits, bit i for Lints[i],
// so the texts live here and in each host, not in backstop.wasm.
type Lint struct {
	Code   string `json:"code"`  // stable: BP001…
	Name   string `json:"name"`  // the Go constant's name, snake_case
	Field  string `json:"field"` // the field path that makes it fire
	Reason string `json:"reason"`
}

// Export is one function the module exports: its parameters and result
// (wasm value types), and what it returns. Hosts check every signature
// against the module when they start.
type Export struct {
	Name    string  `json:"name"`
	Params  []Param `json:"params"`
	Result  string  `json:"result"`
	Returns string  `json:"returns"`
	Method  *Method `json:"method,omitempty"`
}

// Param is one parameter of an Export.
type Param struct {
	Name string `json:"name"`
	Type string `json:"type"` // i32 i64 f64
}

// Signature is the export's signature as ABI.md writes it.
func (e Export) Signature() string {
	ps := make([]string, len(e.Params))
	for i, p := range e.Params {
		ps[i] = p.Name + " " + p.Type
	}
	return "(" + strings.Join(ps, ", ") + ") -> " + e.Result
}

// Limit is a named constant of the ABI.
type Limit struct {
	Name  string `json:"name"`
	Value int64  `json:"value"`
	Doc   string `json:"doc"`
}

// ErrCode is a negative result of the exports.
type ErrCode struct {
	Name string `json:"name"`
	Code int    `json:"code"`
	Doc  string `json:"doc"`
}

// Type is how a host converts a failure field's value: what it accepts,
// said as every host's error says it ("must be an integer (got …)"), and
// for grpc_code the status names by code.
type Type struct {
	Name    string   `json:"name"`
	Expects string   `json:"expects"`
	Names   []string `json:"names,omitempty"`
	Doc     string   `json:"doc"`
}

// Field is one field of a failure: its type (one of Types) says how a host
// converts it, and where it
// goes: Record names its batch-record field (and decide parameter),
// String its string slot, Flag the flag bit it sets.
type Field struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Record string `json:"record,omitempty"`
	String string `json:"string,omitempty"`
	Flag   string `json:"flag,omitempty"`
	// Input is the field's name in a failure's input (the vectors', and
	// every SDK's), when it is not Name.
	Input string `json:"input,omitempty"`
	// Names are the status names a code field also takes, indexed by
	// code (in any ASCII letter case): its type's, filled in by check, so
	// the list is written once, in types.
	Names []string `json:"-"`
	// Error marks what an error returned by the caller's code says about
	// the failure (its status, kind, hints, signals), as opposed to the
	// caller's own facts (attempt, method, key, times).
	Error bool   `json:"error,omitempty"`
	Doc   string `json:"doc"`
	// Bit is the flag's bit (filled from Flags; -1 without a flag).
	Bit int `json:"-"`
}

// InputName is the field's name in a failure's input: the vectors' and
// every SDK's (in its own case).
func (f Field) InputName() string {
	if f.Input != "" {
		return f.Input
	}
	return f.Name
}

// Flag is one bit of decide's flags and a batch record's.
type Flag struct {
	Name string `json:"name"`
	Bit  int    `json:"bit"`
	Doc  string `json:"doc"`
}

// Named is a name with a doc.
type Named struct {
	Name string `json:"name"`
	Doc  string `json:"doc"`
}

// Record is decide_batch's input record.
type Record struct {
	Size       int           `json:"size"`
	ResultSize int           `json:"result_size"`
	Fields     []RecordField `json:"fields"`
}

// RecordField is one little-endian field of a record.
type RecordField struct {
	Name   string `json:"name"`
	Type   string `json:"type"` // i64 f64 i32 u32 u16
	Offset int    `json:"offset"`
	Doc    string `json:"doc"`
}

// ValueTag is one type of the failure value encoding that decide_value and
// outcome_value read (ABI.md, "decide_value"): its tag byte and payload.
type ValueTag struct {
	Name    string `json:"name"`
	Tag     int    `json:"tag"`
	Payload string `json:"payload"`
	Doc     string `json:"doc"`
}

// Enum is a closed set of codes and names.
type Enum struct {
	Name   string  `json:"name"`
	Go     string  `json:"go"` // the policy package's type ("" none)
	Doc    string  `json:"doc"`
	Values []Value `json:"values"`
}

// Value is one member of an Enum.
type Value struct {
	Code    int    `json:"code"`
	Name    string `json:"name"`
	Go      string `json:"go"`
	Action  string `json:"action,omitempty"`  // reasons: the decision's action
	Outcome bool   `json:"outcome,omitempty"` // reasons: an outcome's only
	Doc     string `json:"doc"`
}

// Word is a packed i64 result: bit fields, never negative.
type Word struct {
	Name   string      `json:"name"`
	Go     string      `json:"go"` // the policy package's struct ("" none)
	Doc    string      `json:"doc"`
	Fields []WordField `json:"fields"`
}

// WordField is a bit field of a Word: a value, an Enum's code or a bool.
type WordField struct {
	Name string `json:"name"`
	Lo   int    `json:"lo"`
	Bits int    `json:"bits"`
	Enum string `json:"enum,omitempty"`
	Bool bool   `json:"bool,omitempty"`
	// Decision limits a reason field to the decision's reasons (an
	// outcome's own do not fit it).
	Decision bool   `json:"decision,omitempty"`
	Doc      string `json:"doc"`
	// E is the Enum named by Enum (filled on load).
	E *Enum `json:"-"`
}

// Values are the codes the field holds.
func (f WordField) Values() []Value {
	if f.Decision {
		return f.E.DecisionReasons()
	}
	return f.E.Values
}

// Hi is the field's highest bit.
func (f WordField) Hi() int { return f.Lo + f.Bits - 1 }

// Mask is the field's mask before shifting.
func (f WordField) Mask() uint64 { return 1<<f.Bits - 1 }

func parse(data []byte) (*Schema, error) {
	// Strict decoding, so a misspelt key fails; "$comment" is for readers.
	var s Schema
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	delete(raw, "$comment")
	clean, _ := json.Marshal(raw)
	dec := json.NewDecoder(strings.NewReader(string(clean)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, err
	}
	return &s, s.check()
}

// check refuses a schema whose parts do not fit together, so that a
// mistake fails `make contract`, not a host at run time.
func (s *Schema) check() error {
	bits := map[string]int{}
	used := map[int]string{}
	for _, f := range s.Flags {
		if f.Bit < 0 || f.Bit > 31 || used[f.Bit] != "" {
			return fmt.Errorf("flags: %s: bit %d is out of range or taken", f.Name, f.Bit)
		}
		used[f.Bit], bits[f.Name] = f.Name, f.Bit
	}
	recs := map[string]bool{}
	end := 0
	for _, r := range s.Record.Fields {
		recs[r.Name] = true
		if r.Offset < end || r.Offset%size(r.Type) != 0 {
			return fmt.Errorf("record: %s: offset %d overlaps or is misaligned", r.Name, r.Offset)
		}
		end = r.Offset + size(r.Type)
	}
	if end != s.Record.Size {
		return fmt.Errorf("record: fields end at %d, not at size %d", end, s.Record.Size)
	}
	slots := map[string]bool{}
	for _, st := range s.Strings {
		slots[st.Name] = true
	}
	types := map[string]*Type{}
	for i, t := range s.Types {
		if t.Expects == "" || strings.ContainsAny(t.Expects, "`$\\") {
			return fmt.Errorf("types: %s: expects must be plain text", t.Name)
		}
		if (t.Name == "grpc_code") != (len(t.Names) > 0) {
			return fmt.Errorf("types: %s: the grpc_code type, and only it, has the status names (names)", t.Name)
		}
		types[t.Name] = &s.Types[i]
	}
	for i := range s.Failure {
		f := &s.Failure[i]
		f.Bit = -1
		t, ok := types[f.Type]
		if !ok {
			return fmt.Errorf("failure: %s: unknown type %q", f.Name, f.Type)
		}
		f.Names = t.Names
		if f.Record != "" && !recs[f.Record] {
			return fmt.Errorf("failure: %s: no record field %q", f.Name, f.Record)
		}
		if f.String != "" && !slots[f.String] {
			return fmt.Errorf("failure: %s: no string slot %q", f.Name, f.String)
		}
		if f.Flag != "" {
			b, ok := bits[f.Flag]
			if !ok {
				return fmt.Errorf("failure: %s: no flag %q", f.Name, f.Flag)
			}
			f.Bit = b
		}
		if f.Type == "bool" && f.Flag == "" {
			return fmt.Errorf("failure: %s: a bool field needs a flag bit", f.Name)
		}
	}
	for _, e := range s.Exports {
		for _, t := range append([]string{e.Result}, typesOf(e.Params)...) {
			if t != "i32" && t != "i64" && t != "f64" {
				return fmt.Errorf("exports: %s: unknown value type %q", e.Name, t)
			}
		}
	}
	for i, v := range s.Values {
		if v.Tag != i || v.Name == "" || v.Payload == "" {
			return fmt.Errorf("values: %s: tags must be 0, 1, 2… in order, each with a name and a payload", v.Name)
		}
	}
	codes := map[string]bool{}
	for _, l := range s.Lints {
		if codes[l.Code] || l.Field == "" || l.Reason == "" || strings.Contains(l.Reason, "\n") {
			return fmt.Errorf("lints: %s: duplicate code, or no field or one-line reason", l.Code)
		}
		codes[l.Code] = true
	}
	if len(s.Lints) > 62 {
		return fmt.Errorf("lints: %d do not fit policy_lints' 62 bits", len(s.Lints))
	}
	if err := s.checkFacts(); err != nil {
		return err
	}
	if err := s.checkMethods(); err != nil {
		return err
	}
	enums := map[string]*Enum{}
	for _, e := range s.Enums {
		enums[e.Name] = e
		sort.SliceStable(e.Values, func(i, j int) bool { return e.Values[i].Code < e.Values[j].Code })
	}
	for _, w := range s.Words {
		taken := uint64(0)
		for i := range w.Fields {
			f := &w.Fields[i]
			if f.Enum != "" {
				if f.E = enums[f.Enum]; f.E == nil {
					return fmt.Errorf("words: %s.%s: no enum %q", w.Name, f.Name, f.Enum)
				}
				if top := f.Values()[len(f.Values())-1].Code; uint64(top) > f.Mask() {
					return fmt.Errorf("words: %s.%s: %d bits cannot hold %s %d", w.Name, f.Name, f.Bits, f.Enum, top)
				}
			}
			m := f.Mask() << f.Lo
			if f.Hi() > 62 || taken&m != 0 {
				return fmt.Errorf("words: %s.%s: bits %d-%d overlap or reach the sign bit", w.Name, f.Name, f.Lo, f.Hi())
			}
			taken |= m
		}
	}
	return nil
}

func size(t string) int {
	switch t {
	case "i64", "f64":
		return 8
	case "i32", "u32":
		return 4
	case "u16":
		return 2
	}
	return 1 << 30
}

// ByBits are the fields from the lowest bit up.
func (w *Word) ByBits() []WordField {
	out := append([]WordField(nil), w.Fields...)
	sort.Slice(out, func(i, j int) bool { return out[i].Lo < out[j].Lo })
	return out
}

// Top is the word's highest used bit.
func (w *Word) Top() int {
	top := 0
	for _, f := range w.Fields {
		top = max(top, f.Hi())
	}
	return top
}

// Type returns the type named name.
func (s *Schema) Type(name string) Type {
	for _, t := range s.Types {
		if t.Name == name {
			return t
		}
	}
	panic("contractgen: no type " + name)
}

// Enum returns the enum named name.
func (s *Schema) Enum(name string) *Enum {
	for _, e := range s.Enums {
		if e.Name == name {
			return e
		}
	}
	panic("contractgen: no enum " + name)
}

// Word returns the word named name.
func (s *Schema) Word(name string) *Word {
	for _, w := range s.Words {
		if w.Name == name {
			return w
		}
	}
	panic("contractgen: no word " + name)
}

// Limit returns the value of the limit named name.
func (s *Schema) Limit(name string) int64 {
	for _, l := range s.Limits {
		if l.Name == name {
			return l.Value
		}
	}
	panic("contractgen: no limit " + name)
}

// LimitDoc returns the doc of the limit named name.
func (s *Schema) LimitDoc(name string) string {
	for _, l := range s.Limits {
		if l.Name == name {
			return l.Doc
		}
	}
	panic("contractgen: no limit " + name)
}

// FlagMask is every known flag bit.
func (s *Schema) FlagMask() uint32 {
	var m uint32
	for _, f := range s.Flags {
		m |= 1 << f.Bit
	}
	return m
}

// MaxFlagBit is the highest flag bit (flags must be below 2^(MaxFlagBit+1)).
func (s *Schema) MaxFlagBit() int {
	top := 0
	for _, f := range s.Flags {
		top = max(top, f.Bit)
	}
	return top
}

// BoolFields are the failure's bool fields: each sets its own flag bit.
func (s *Schema) BoolFields() []Field {
	var out []Field
	for _, f := range s.Failure {
		if f.Type == "bool" {
			out = append(out, f)
		}
	}
	return out
}

// DecisionReasons are the reasons a decision carries (not an outcome's
// only).
func (e *Enum) DecisionReasons() []Value {
	var out []Value
	for _, v := range e.Values {
		if !v.Outcome {
			out = append(out, v)
		}
	}
	return out
}

// Top is the largest code.
func (e *Enum) Top() int { return e.Values[len(e.Values)-1].Code }

// Dense returns the names indexed by code, "" in the gaps.
func (e *Enum) Dense() []string {
	out := make([]string, e.Top()+1)
	for _, v := range e.Values {
		out[v.Code] = v.Name
	}
	return out
}

func typesOf(ps []Param) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Type
	}
	return out
}
