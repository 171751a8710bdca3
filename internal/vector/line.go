package vector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/backstop-dev/backstop/internal/failvalue"
	"github.com/backstop-dev/backstop/policy"
)

// Limits of one `decide` input line, the same in every host's command
// (testdata/vectors/README.md, "Input lines"). No valid failure comes near
// them; they bound what one line can cost.
const (
	// MaxLineBytes is the longest line read, without its "\n". A longer
	// line is answered with an error and skipped without being buffered.
	MaxLineBytes = 4 << 20
	// MaxDepth is the deepest nesting of arrays and objects in a line (the
	// failure object itself is depth 1).
	MaxDepth = 32
	// MaxNumberChars is the longest number literal in a line.
	MaxNumberChars = 32
	// MaxStringBytes is the longest method, error kind or hint, in UTF-8
	// bytes: a batch record holds its lengths as u16 (wasm/ABI.md).
	MaxStringBytes = failvalue.MaxStringBytes
)

// LineError is a line that holds no failure object: blank, not UTF-8,
// not JSON, or past a limit. Its message starts with "invalid input line: ".
type LineError struct {
	Reason string
}

func (e *LineError) Error() string { return "invalid input line: " + e.Reason }

// Line-level errors, checked in this order.
var (
	ErrLineTooLong  = &LineError{fmt.Sprintf("longer than %d bytes", MaxLineBytes)}
	ErrLineEmpty    = &LineError{"empty"}
	ErrLineNotUTF8  = &LineError{"not UTF-8"}
	ErrLineTooDeep  = &LineError{fmt.Sprintf("nested deeper than %d levels", MaxDepth)}
	ErrLineLongNum  = &LineError{fmt.Sprintf("a number longer than %d characters", MaxNumberChars)}
	ErrLineNotJSON  = &LineError{"not valid JSON"}
	ErrLineNotObjct = &LineError{"expected a JSON object"}
)

// DecodeLine parses one `decide` input line (the bytes before its "\n";
// a "\r" left before it is JSON whitespace). It returns a *LineError for a
// line that holds no failure object, a *policy.InputError naming the field
// for an invalid field, or the input. Absent (or null) random and now_ms
// are 0: the answer depends on the line only.
func DecodeLine(line []byte) (Input, error) {
	switch {
	case len(line) > MaxLineBytes:
		return Input{}, ErrLineTooLong
	case len(bytes.Trim(line, " \t\r")) == 0:
		return Input{}, ErrLineEmpty
	case !utf8.Valid(line):
		return Input{}, ErrLineNotUTF8
	}
	depth, longNum := scanLine(line)
	switch {
	case depth > MaxDepth:
		return Input{}, ErrLineTooDeep
	case longNum:
		return Input{}, ErrLineLongNum
	case !json.Valid(line):
		return Input{}, ErrLineNotJSON
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Input{}, ErrLineNotJSON
	}
	if _, ok := v.(map[string]any); !ok {
		return Input{}, ErrLineNotObjct
	}
	return FromValue(v)
}

// DurationField is the one member of a `decide` input line that is not a
// failure field: how long the call took, in ms. The command reports it to
// the breaker's slow-call rate (record_duration) at the line's now_ms
// before it decides the failure, as a loop does once per call. It is
// line-only: no library reads it as part of a failure.
const DurationField = "duration_ms"

// Duration is a line's duration_ms to record. Record is false when the
// line has none (absent or null), or its now_ms is not valid (the line's
// error then says so): a duration is recorded at a valid now_ms only.
type Duration struct {
	Record bool
	Ms     int64
	NowMs  int64
}

// DecodeCallLine is DecodeLine for a line that may hold a duration_ms.
// Errors come in this order: the line's, an unknown name (duration_ms is
// known), duration_ms (an integer, "must be >= 0" when negative), then the
// failure's fields. A valid duration at a valid now_ms is returned with
// the failure's error too: the call happened, and the command records its
// duration before it answers the failure's error.
func DecodeCallLine(line []byte) (Input, Duration, error) {
	in, err := DecodeLine(line)
	var le *LineError
	if errors.As(err, &le) {
		return in, Duration{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var obj map[string]any
	if dec.Decode(&obj) != nil {
		return Input{}, Duration{}, ErrLineNotJSON
	}
	raw, has := obj[DurationField]
	if !has {
		return in, Duration{}, err
	}
	delete(obj, DurationField)
	in, err = FromValue(obj)
	var ie *policy.InputError
	if errors.As(err, &ie) && ie.Reason == "unknown field" {
		return Input{}, Duration{}, err
	}
	if raw == nil {
		return in, Duration{}, err
	}
	ms, msErr := failvalue.Int64(DurationField, Native(raw))
	if msErr == nil && ms < 0 {
		msErr = &policy.InputError{Field: DurationField, Reason: "must be >= 0 (got " + strconv.FormatInt(ms, 10) + ")"}
	}
	if msErr != nil {
		return Input{}, Duration{}, msErr
	}
	now, nowErr := FromValue(map[string]any{"now_ms": obj["now_ms"]})
	return in, Duration{Record: nowErr == nil, Ms: ms, NowMs: now.NowMs}, err
}

// scanLine returns the deepest nesting of brackets outside strings and
// whether a run of number characters outside strings is longer than
// MaxNumberChars. A string runs from a '"' to the next '"' not escaped by
// a '\'; an unterminated one runs to the end. Only ASCII is significant, so
// scanning bytes, UTF-16 units or code points gives the same answer.
func scanLine(line []byte) (depth int, longNum bool) {
	d, run := 0, 0
	for i := 0; i < len(line); i++ {
		switch c := line[i]; c {
		case '"':
			i++
			for i < len(line) && line[i] != '"' {
				if line[i] == '\\' {
					i++
				}
				i++
			}
			run = 0
		case '[', '{':
			d++
			depth = max(depth, d)
			run = 0
		case ']', '}':
			d--
			run = 0
		case '-', '+', '.', 'e', 'E', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			if run++; run > MaxNumberChars {
				longNum = true
			}
		default:
			run = 0
		}
	}
	return depth, longNum
}

// Answer is the line `decide` writes for a decision or an error (with its
// "\n"): {"action","delay_ms","reason","class"}, or {"error": message}
// where the message of an invalid field is "<field>: <reason>". Every
// host's command writes the same bytes.
func Answer(d policy.Decision, err error) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err != nil {
		var le *LineError
		msg := err.Error()
		if !errors.As(err, &le) {
			msg = FromDecision(d, err).Error
		}
		enc.Encode(struct {
			Error string `json:"error"`
		}{msg})
	} else {
		enc.Encode(FromDecision(d, nil))
	}
	return b.Bytes()
}
