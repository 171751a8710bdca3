package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// policy_lints answers the policy's lint bits, after lint_ignore, and -1
// for an unknown handle.
func TestPolicyLints(t *testing.T) {
	for _, c := range []struct {
		src  string
		want []string
	}{
		{`{"jitter": {"mode": "none"}}`, []string{"BP002"}},
		{`{"jitter": {"mode": "none"}, "lint_ignore": {"BP002": "a test"}}`, nil},
		{`{"max_attempts": 30, "backoff": {"strategy": "none"}, "attempt_timeout": "5s"}`, []string{"BP001", "BP003"}},
		{`{"attempt_timeout": "5s", "classify": {"default": "retryable"}}`, []string{"BP004", "BP005"}},
		{"default", nil},
	} {
		w := policy_lints(load(t, c.src))
		var got []string
		for _, l := range policy.LintsOf(uint64(w)) {
			got = append(got, l.Code)
		}
		if w < 0 || len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) || (len(got) > 1 && got[1] != c.want[1]) {
			t.Errorf("%s: policy_lints = %d %v, want %v", c.src, w, got, c.want)
		}
	}
	if policy_lints(0) != errHandle {
		t.Error("policy_lints(0): want -1")
	}
}

// The module reports lints as bits: their reasons stay in the hosts (from
// contract/abi.json), and the linker leaves them out of backstop.wasm.
func TestModuleCarriesNoLintText(t *testing.T) {
	mod, err := os.ReadFile("../contract/backstop.wasm")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range policy.LintsOf(^uint64(0)) {
		if bytes.Contains(mod, []byte(l.Message)) {
			t.Errorf("backstop.wasm carries %s's reason %q", l.Code, l.Message)
		}
	}
	if !bytes.Contains(mod, []byte("policy_lints")) {
		t.Error("backstop.wasm exports no policy_lints: run make wasm")
	}
}
