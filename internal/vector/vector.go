// Package vector is the JSON shape of the shared decision vectors in
// testdata/vectors: the contract every host (Go, Node.js, Python) reads.
// The `backstop decide` command speaks the same shapes on stdin and stdout.
package vector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/backstop-dev/backstop/internal/failvalue"
	"github.com/backstop-dev/backstop/policy"
)

// File is testdata/vectors/vectors.json.
type File struct {
	ABIVersion int     `json:"abi_version"`
	Comment    string  `json:"comment"`
	Groups     []Group `json:"groups"`
}

// Group is a set of cases decided by one policy. Cases of a group run in
// order on one fresh policy instance, so stateful groups (budget, breaker)
// are sequences.
type Group struct {
	Name     string          `json:"name"`
	Preset   string          `json:"preset,omitempty"`
	Policy   json.RawMessage `json:"policy,omitempty"`
	Stateful bool            `json:"stateful,omitempty"`
	Cases    []Case          `json:"cases"`
}

// PolicyBytes returns what a host loads for the group: the preset name or
// the policy object.
func (g *Group) PolicyBytes() []byte {
	if g.Preset != "" {
		return []byte(g.Preset)
	}
	return g.Policy
}

// Case is one step: a decision (Input and Expect); or, when Op is
// "success", a success reported at NowMs to the budget and the breaker; or,
// when Op is "acquire", permission for a call asked at NowMs, answered by
// Permit; or, when Op is "attempt_timeout", the timeout of an attempt
// starting ElapsedMs after the first: TimeoutMs (0: none), or Error; or,
// when Op is "connect_timeout", the policy's connect_timeout: TimeoutMs;
// or, when Op is "duration", a call that ended at NowMs and took
// DurationMs, reported to the breaker's slow-call window (record_duration).
type Case struct {
	Op         string  `json:"op,omitempty"`
	NowMs      int64   `json:"now_ms,omitempty"`
	DurationMs int64   `json:"duration_ms,omitempty"`
	ElapsedMs  int64   `json:"elapsed_ms,omitempty"`
	Input      *Input  `json:"input,omitempty"`
	Expect     *Expect `json:"expect,omitempty"`
	Permit     *Permit `json:"permit,omitempty"`
	TimeoutMs  *int64  `json:"timeout_ms,omitempty"`
	Error      string  `json:"error,omitempty"`
}

// FromTimeout fills an attempt_timeout case's answer from the policy's.
func (c *Case) FromTimeout(ms int64, err error) {
	if err != nil {
		c.Error = errorText(err)
		return
	}
	c.TimeoutMs = &ms
}

// TimeoutAnswer is an attempt_timeout case's answer as text, to compare
// and print: "timeout_ms 2000", or the error.
func (c *Case) TimeoutAnswer() string {
	if c.TimeoutMs == nil {
		return "error " + c.Error
	}
	return "timeout_ms " + strconv.FormatInt(*c.TimeoutMs, 10)
}

// Permit is the answer of acquire in the vector shape.
type Permit struct {
	Allowed   bool   `json:"allowed"`
	RetryInMs int64  `json:"retry_in_ms"`
	State     string `json:"state"`
}

// FromPermit converts a permit to the vector shape.
func FromPermit(p policy.Permit) Permit {
	return Permit{Allowed: p.Allowed, RetryInMs: p.RetryInMs, State: p.State.String()}
}

// Expect is a decision, or the error message of an invalid input.
type Expect struct {
	Action  string `json:"action,omitempty"`
	DelayMs int64  `json:"delay_ms"`
	Reason  string `json:"reason,omitempty"`
	Class   string `json:"class,omitempty"`
	Error   string `json:"error,omitempty"`
}

// FromDecision converts a decision (or an error) to the vector shape. An
// *policy.InputError keeps its field and reason ("attempt: must be >= 1
// (got 0)"), the message every host reports.
func FromDecision(d policy.Decision, err error) Expect {
	if err != nil {
		return Expect{Error: errorText(err)}
	}
	return Expect{Action: d.Action.String(), DelayMs: d.DelayMs, Reason: d.Reason.String(), Class: d.Class.String()}
}

// errorText is an error in the vector shape: an *policy.InputError's (or
// *policy.EventError's) field and reason, without its "invalid failure: "
// ("invalid event: ") prefix.
func errorText(err error) string {
	var ie *policy.InputError
	if errors.As(err, &ie) {
		return ie.Field + ": " + ie.Reason
	}
	var ee *policy.EventError
	if errors.As(err, &ee) {
		return ee.Field + ": " + ee.Reason
	}
	return err.Error()
}

// Float is a float64 that round-trips NaN and ±Inf through JSON as the
// strings "NaN", "Infinity" and "-Infinity" (as JavaScript and Python print
// them).
type Float float64

func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	switch {
	case math.IsNaN(v):
		return []byte(`"NaN"`), nil
	case math.IsInf(v, 1):
		return []byte(`"Infinity"`), nil
	case math.IsInf(v, -1):
		return []byte(`"-Infinity"`), nil
	}
	return []byte(strconv.FormatFloat(v, 'g', -1, 64)), nil
}

func (f *Float) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"NaN"`:
		*f = Float(math.NaN())
	case `"Infinity"`, `"+Infinity"`:
		*f = Float(math.Inf(1))
	case `"-Infinity"`:
		*f = Float(math.Inf(-1))
	default:
		v, err := strconv.ParseFloat(string(b), 64)
		if err != nil {
			return fmt.Errorf("random: must be a number, \"NaN\", \"Infinity\" or \"-Infinity\" (got %s)", b)
		}
		*f = Float(v)
	}
	return nil
}

// GRPCCode is a gRPC status code that reads from a number or a name
// ("UNAVAILABLE") and writes as a number.
type GRPCCode int

func (c *GRPCCode) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var name string
		if err := json.Unmarshal(b, &name); err != nil {
			return err
		}
		code, ok := failvalue.GRPCCodeByName(name)
		if !ok {
			return fmt.Errorf("grpc_code: unknown gRPC status name %s", failvalue.Quote(name))
		}
		*c = GRPCCode(code)
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("grpc_code: must be a number or a status name (got %s)", b)
	}
	*c = GRPCCode(n)
	return nil
}

// Format writes the file with one case per line: small, and diffs show
// which decisions changed.
func (f *File) Format() ([]byte, error) {
	var b bytes.Buffer
	head, err := json.Marshal(struct {
		ABIVersion int    `json:"abi_version"`
		Comment    string `json:"comment"`
	}{f.ABIVersion, f.Comment})
	if err != nil {
		return nil, err
	}
	b.Write(head[:len(head)-1])
	b.WriteString(`,"groups":[`)
	for i, g := range f.Groups {
		cases := g.Cases
		g.Cases = nil
		gb, err := json.Marshal(g)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n")
		b.Write(gb[:len(gb)-len(`null}`)])
		b.WriteString("[")
		for j, c := range cases {
			cb, err := json.Marshal(c)
			if err != nil {
				return nil, err
			}
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString("\n ")
			b.Write(cb)
		}
		b.WriteString("\n]}")
	}
	b.WriteString("\n]}\n")
	return b.Bytes(), nil
}
