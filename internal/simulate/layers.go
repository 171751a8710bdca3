package simulate

import (
	"fmt"
	"math/rand/v2"

	"github.com/backstop-dev/backstop/policy"
)

// MaxLayers bounds the layers experiment: with 5 attempts a layer, ten
// layers already make ten million calls to the bottom without the rule.
const MaxLayers = 10

// LayerRun is one request through the layers, each retrying with the
// policy, to a bottom service that is down for the recovery time.
type LayerRun struct {
	// BottomCalls is the calls that reached the bottom service.
	BottomCalls int64
	// Succeeded says the request got through; else Reason is why the top
	// layer gave up.
	Succeeded bool
	Reason    policy.Reason
	// EndMs is when the top layer finished, from the first call.
	EndMs int64
}

// LayerRow compares one depth with the rule of retry at one layer
// (docs/layers.md: a layer gives up a failure a layer below already
// retried) and without it (every layer retries whatever fails below).
type LayerRow struct {
	Layers        int
	Without, With LayerRun
}

// Layers runs one request through 1, 2, ... layers layers of retry
// loops (the policy src, a preset name or a policy file; each layer a
// service of its own, with its own budget and breaker) to a bottom
// service that answers 503 until the recovery time (WithRecovery) and 200
// after. A call takes no time; the delays are the policy's, drawn from
// the seeded PRNG (WithSeed), the same draws with and without the rule.
//
// A policy with retried_downstream: retry opts out of the rule: both runs
// are then the same.
func Layers(src []byte, layers int, opts ...Option) ([]LayerRow, error) {
	c := defaults
	for _, o := range opts {
		o(&c)
	}
	switch {
	case layers < 1 || layers > MaxLayers:
		return nil, fmt.Errorf("simulate: layers must be in 1..%d (got %d)", MaxLayers, layers)
	case c.recoveryMs < 0:
		return nil, fmt.Errorf("simulate: recovery must be >= 0 (got %dms)", c.recoveryMs)
	}
	rows := make([]LayerRow, layers)
	for n := 1; n <= layers; n++ {
		rows[n-1].Layers = n
		for _, rule := range []bool{false, true} {
			s := &stack{src: src, rule: rule, recoveryMs: c.recoveryMs,
				rng: rand.New(rand.NewPCG(c.seed, 0x6c61796572730000))} // "layers"
			if err := s.build(n); err != nil {
				return nil, err
			}
			r, err := s.call(n, 0)
			if err != nil {
				return nil, err
			}
			run := LayerRun{BottomCalls: s.bottomCalls, Succeeded: r.ok, Reason: r.reason, EndMs: r.endMs}
			if rule {
				rows[n-1].With = run
			} else {
				rows[n-1].Without = run
			}
		}
	}
	return rows, nil
}

// stack is the layers of one run: level 0 the bottom service, level k a
// loop calling level k-1 with policy ps[k-1].
type stack struct {
	src         []byte
	rule        bool
	recoveryMs  int64
	rng         *rand.Rand
	ps          []*policy.Policy
	bottomCalls int64
}

func (s *stack) build(n int) error {
	s.ps = make([]*policy.Policy, n)
	for i := range s.ps {
		p, err := policy.Load(s.src)
		if err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		s.ps[i] = p
	}
	return nil
}

type layerResult struct {
	ok     bool
	reason policy.Reason
	endMs  int64
}

// call runs level k at virtual time t.
func (s *stack) call(k int, t int64) (layerResult, error) {
	if k == 0 {
		s.bottomCalls++
		if s.bottomCalls > maxEvents {
			return layerResult{}, fmt.Errorf("simulate: stopped after %d calls to the bottom: the policy retries without a limit that bites", maxEvents)
		}
		return layerResult{ok: t >= s.recoveryMs, endMs: t}, nil
	}
	p := s.ps[k-1]
	start, prev := t, int64(0)
	for attempt := int64(1); ; attempt++ {
		r, err := s.call(k-1, t)
		if err != nil {
			return r, err
		}
		t = r.endMs
		if r.ok {
			p.RecordSuccess(epochMs + t)
			return r, nil
		}
		f := policy.Failure{Attempt: attempt, HTTPStatus: 503, ElapsedMs: t - start, NowMs: epochMs + t,
			Random: s.rng.Float64(), PrevDelayMs: prev,
			// A loop below gave up (a breaker's refusal retried nothing).
			RetriedDownstream: s.rule && k > 1 && r.reason != policy.CircuitOpen}
		d, err := p.Decide(f)
		if err != nil {
			return layerResult{}, fmt.Errorf("simulate: %w", err)
		}
		if d.Action != policy.Retry {
			return layerResult{reason: d.Reason, endMs: t}, nil
		}
		var ok bool
		if t, ok = after(t, d.DelayMs); !ok {
			return layerResult{}, errClock
		}
		prev = d.DelayMs
	}
}
