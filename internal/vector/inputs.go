package vector

import (
	"bytes"
	"encoding/json"
)

// InputsFile is testdata/vectors/inputs.json: raw `decide` input lines,
// and failure values, each with the one output line every host gives. It
// is the contract for bad input: the same line or value gets the same
// answer, byte for byte, from every host's command and library.
type InputsFile struct {
	Comment string       `json:"comment"`
	Policy  string       `json:"policy"`
	Limits  InputsLimits `json:"limits"`
	Cases   []InputCase  `json:"cases"`
}

// InputsLimits are the limits of DecodeLine, for the hosts' tests.
type InputsLimits struct {
	MaxLineBytes   int `json:"max_line_bytes"`
	MaxDepth       int `json:"max_depth"`
	MaxNumberChars int `json:"max_number_chars"`
	MaxStringBytes int `json:"max_string_bytes"`
}

// InputCase is one line (Line, or LineHex for bytes that are not UTF-8)
// or one failure value (Value, with Revive's tags: the libraries' decide
// and decide_many only), and Output, the answer line without its "\n".
// CLI cases are for the commands only: a library may accept more (the
// Node.js host also takes camelCase names).
type InputCase struct {
	Note    string          `json:"note,omitempty"`
	Line    *string         `json:"line,omitempty"`
	LineHex string          `json:"line_hex,omitempty"`
	Value   json.RawMessage `json:"value,omitempty"`
	CLI     bool            `json:"cli,omitempty"`
	Output  string          `json:"output"`
}

// Format writes the file with one case per line.
func (f *InputsFile) Format() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	head := *f
	head.Cases = nil
	if err := enc.Encode(head); err != nil {
		return nil, err
	}
	out := bytes.TrimSuffix(b.Bytes(), []byte("null}\n"))
	out = append([]byte(nil), out...)
	out = append(out, '[')
	for i, c := range f.Cases {
		b.Reset()
		if err := enc.Encode(c); err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, "\n "...)
		out = append(out, bytes.TrimSuffix(b.Bytes(), []byte("\n"))...)
	}
	return append(out, "\n]}\n"...), nil
}
