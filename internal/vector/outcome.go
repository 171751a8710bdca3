package vector

import (
	"encoding/json"

	"github.com/backstop-dev/backstop/policy"
)

// OutcomesFile is testdata/outcomes/cases.json: sequences of job events
// and the outcome the core gives each (policy.Policy.Outcome, the module's
// outcome export), which every language's worker replays.
type OutcomesFile struct {
	ABIVersion int           `json:"abi_version"`
	Comment    string        `json:"comment"`
	OpenPollMs int64         `json:"open_poll_ms"`
	Cases      []OutcomeCase `json:"cases"`
}

// OutcomeCase is a sequence of steps on one fresh policy: Preset (a name)
// or Policy (an object).
type OutcomeCase struct {
	Name     string          `json:"name"`
	Preset   string          `json:"preset,omitempty"`
	Policy   json.RawMessage `json:"policy,omitempty"`
	Stateful bool            `json:"stateful,omitempty"`
	Steps    []OutcomeStep   `json:"steps"`
}

// PolicyBytes returns what a host loads for the case.
func (c *OutcomeCase) PolicyBytes() []byte {
	if c.Preset != "" {
		return []byte(c.Preset)
	}
	return c.Policy
}

// OutcomeStep is one job event and its answer: Expect, and Error for an
// invalid failure (Expect dead-letters it) or, alone, for an invalid event.
type OutcomeStep struct {
	// Event is "before", "success", "failure" or "delivered".
	Event string `json:"event"`
	// NowMs is the time of a before or success event; a failure's is
	// Failure.NowMs.
	NowMs   int64  `json:"now_ms,omitempty"`
	Failure *Input `json:"failure,omitempty"`
	// Deliveries and MaxDeliveries: a delivered event's.
	Deliveries    int64          `json:"deliveries,omitempty"`
	MaxDeliveries int64          `json:"max_deliveries,omitempty"`
	Expect        *OutcomeExpect `json:"expect,omitempty"`
	Error         string         `json:"error,omitempty"`
}

// OutcomeExpect is an outcome in the file's names.
type OutcomeExpect struct {
	Action  string `json:"action"`
	Reason  string `json:"reason"`
	DelayMs int64  `json:"delay_ms"`
	Pause   bool   `json:"pause"`
	Count   string `json:"count"`
	Invalid bool   `json:"invalid"`
}

// JobEvent converts the step to the policy's JobEvent.
func (s *OutcomeStep) JobEvent() (policy.JobEvent, error) {
	var e policy.JobEvent
	if err := e.Event.UnmarshalText([]byte(s.Event)); err != nil {
		return e, err
	}
	e.Failure.NowMs = s.NowMs
	if s.Failure != nil {
		e.Failure = s.Failure.Failure()
	}
	e.Deliveries, e.MaxDeliveries = s.Deliveries, s.MaxDeliveries
	return e, nil
}

// Answer fills the step's Expect and Error from an outcome.
func (s *OutcomeStep) Answer(o policy.Outcome, err error) {
	s.Expect, s.Error = nil, ""
	if err != nil {
		s.Error = errorText(err)
		if !o.Invalid {
			return
		}
	}
	s.Expect = &OutcomeExpect{Action: o.Action.String(), Reason: o.Reason.String(), DelayMs: o.DelayMs,
		Pause: o.Pause, Count: o.Count.String(), Invalid: o.Invalid}
}

// Format writes the file with one step per line.
func (f *OutcomesFile) Format() ([]byte, error) {
	head, err := json.Marshal(struct {
		ABIVersion int    `json:"abi_version"`
		Comment    string `json:"comment"`
		OpenPollMs int64  `json:"open_poll_ms"`
	}{f.ABIVersion, f.Comment, f.OpenPollMs})
	if err != nil {
		return nil, err
	}
	b := append(head[:len(head)-1], `,"cases":[`...)
	for i, c := range f.Cases {
		steps := c.Steps
		c.Steps = nil
		cb, err := json.Marshal(c)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '\n')
		b = append(b, cb[:len(cb)-len(`null}`)]...)
		b = append(b, '[')
		for j, s := range steps {
			sb, err := json.Marshal(s)
			if err != nil {
				return nil, err
			}
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, "\n "...)
			b = append(b, sb...)
		}
		b = append(b, "\n]}"...)
	}
	return append(b, "\n]}\n"...), nil
}
