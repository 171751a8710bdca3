package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

// A loaded policy reports the module's lints (policy_lints), spelled out
// from the schema's table, and the Runtime logs each at load; one its
// lint_ignore names is left out.
func TestPolicyLints(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	rt, err := host.New(ctx, host.SharedCache(), host.WithPoolSize(1),
		host.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	p, err := rt.Load(ctx, []byte(`{"jitter": {"mode": "none"}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := p.Lints()
	if len(got) != 1 || got[0].Code != "BP002" || got[0].Field != "jitter.mode" || !strings.Contains(got[0].Message, "backoff without jitter") {
		t.Errorf("Lints = %v, want BP002 on jitter.mode", got)
	}
	if l := log.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "code=BP002") || !strings.Contains(l, "field=jitter.mode") {
		t.Errorf("log = %q, want a warning with BP002", l)
	}
	log.Reset()
	quiet, err := rt.Load(ctx, []byte(`{"jitter": {"mode": "none"}, "lint_ignore": {"BP002": "a test of the herd"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := quiet.Lints(); len(got) != 0 || log.Len() != 0 {
		t.Errorf("ignored: Lints = %v, log %q, want none", got, log.String())
	}
	if pr, err := rt.Preset(ctx, "batch"); err != nil || len(pr.Lints()) != 0 {
		t.Errorf("preset batch: %v %v", pr.Lints(), err)
	}
}

// TestLintCases loads each policy of testdata/lints/cases.json (generated
// from the native core by `make vectors`) through backstop.wasm: the Go
// host reports exactly its lints, as every other host must.
func TestLintCases(t *testing.T) {
	b, err := os.ReadFile("../testdata/lints/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []struct {
			Name   string          `json:"name"`
			Policy json.RawMessage `json:"policy"`
			Lints  []policy.Lint   `json:"lints"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &file); err != nil || len(file.Cases) == 0 {
		t.Fatalf("%d cases: %v", len(file.Cases), err)
	}
	ctx := context.Background()
	seen := map[string]bool{}
	for _, c := range file.Cases {
		src := []byte(c.Policy)
		var name string
		if json.Unmarshal(src, &name) == nil {
			src = []byte(name)
		}
		p, err := runtime(t).Load(ctx, src)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if got := p.Lints(); !reflect.DeepEqual(got, c.Lints) && (len(got) != 0 || len(c.Lints) != 0) {
			t.Errorf("%s: Lints = %v, want %v", c.Name, got, c.Lints)
		}
		for _, l := range c.Lints {
			seen[l.Code] = true
		}
		p.Close(ctx)
	}
	for _, l := range policy.LintsOf(^uint64(0)) {
		if !seen[l.Code] {
			t.Errorf("no case fires %s", l.Code)
		}
	}
}
