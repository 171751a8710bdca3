package retry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// update regenerates the shared files of the tests it runs from the Go
// run: testdata/metrics/expected.prom, testdata/layers/cases.json.
var update = flag.Bool("update", false, "regenerate the shared testdata files of the tests run from the Go run")

// sequence is testdata/metrics/sequence.json: the outcomes every
// language's retry loop replays.
type sequence struct {
	Policy     string `json:"policy"`
	PolicyName string `json:"policy_name"`
	Target     string `json:"target"`
	StartMs    int64  `json:"start_ms"`
	Calls      []struct {
		AdvanceMs int64    `json:"advance_ms"`
		Outcomes  []string `json:"outcomes"`
		Want      string   `json:"want"`
	} `json:"calls"`
}

// replay runs the shared sequence with metrics in reg.
func replay(t *testing.T, reg prometheus.Registerer) {
	t.Helper()
	b, err := os.ReadFile("../testdata/metrics/sequence.json")
	if err != nil {
		t.Fatal(err)
	}
	var seq sequence
	if err := json.Unmarshal(b, &seq); err != nil {
		t.Fatal(err)
	}
	p := parse(t, seq.Policy)
	clk := &retry.FakeClock{T: time.UnixMilli(seq.StartMs)}
	for i, c := range seq.Calls {
		clk.T = clk.T.Add(time.Duration(c.AdvanceMs) * time.Millisecond)
		n := 0
		op := func(context.Context) (*http.Response, error) {
			if n >= len(c.Outcomes) {
				t.Fatalf("call %d: attempt %d made, the script has %d", i, n+1, len(c.Outcomes))
			}
			o := c.Outcomes[n]
			n++
			switch {
			case o == "ok":
				return &http.Response{StatusCode: 200}, nil
			case o == "timeout":
				return nil, &backstop.Failure{ErrorKind: "timeout"}
			case strings.HasPrefix(o, "http:"):
				f := strings.Split(o, ":")
				s, _ := strconv.Atoi(f[1])
				r := &http.Response{StatusCode: s, Header: http.Header{}, Body: http.NoBody}
				if len(f) > 2 {
					r.Header.Set("Retry-After", f[2])
				}
				return r, nil
			}
			t.Fatalf("call %d: unknown outcome %q", i, o)
			return nil, nil
		}
		_, err := retry.Do(context.Background(), p, op, retry.WithClock(clk), retry.WithMetrics(reg, seq.PolicyName, seq.Target))
		got := "ok"
		var re *retry.Error
		if errors.As(err, &re) {
			got = re.Reason.String()
		} else if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got != c.Want || n != len(c.Outcomes) {
			t.Fatalf("call %d: %s after %d attempts, want %s after %d", i, got, n, c.Want, len(c.Outcomes))
		}
	}
}

// exposition is the text format of g's backstop_client_* families.
func exposition(t *testing.T, g prometheus.Gatherer) []byte {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "backstop_client_") {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return buf.Bytes()
}

// The shared sequence gives the committed exposition, which the Node and
// Python loops must give too.
func TestMetricsSequence(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	replay(t, reg)
	got := exposition(t, reg)
	const golden = "../testdata/metrics/expected.prom"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("exposition differs from %s (go test ./retry -run TestMetricsSequence -update rewrites it):\n%s", golden, got)
	}
}

// A second WithMetrics on the same registry (another call, another
// policy) reuses the registered families.
func TestMetricsReuseRegisteredFamilies(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := parse(t, constant)
	ok := func(context.Context) (int, error) { return 1, nil }
	for _, pol := range []string{"a", "a", "b"} {
		if _, err := retry.Do(context.Background(), p, ok, retry.WithMetrics(reg, pol, "api")); err != nil {
			t.Fatal(err)
		}
	}
	out := string(exposition(t, reg))
	for _, want := range []string{
		`backstop_client_attempts_total{outcome="success",policy="a",target="api"} 2`,
		`backstop_client_attempts_total{outcome="success",policy="b",target="api"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %s in\n%s", want, out)
		}
	}
	// A registry that already holds the families (registered by another
	// package, here a registry wrapping reg) is reused too.
	wrapped := prometheus.WrapRegistererWith(nil, reg)
	if _, err := retry.Do(context.Background(), p, ok, retry.WithMetrics(wrapped, "a", "api")); err != nil {
		t.Fatalf("WithMetrics on a registry holding the families: %v", err)
	}
	if !strings.Contains(string(exposition(t, reg)), `backstop_client_attempts_total{outcome="success",policy="a",target="api"} 3`) {
		t.Fatalf("the reused families did not count:\n%s", exposition(t, reg))
	}
}

func TestMetricsBadInput(t *testing.T) {
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "backstop_client_attempts_total", Help: "someone else's"}))
	tests := []struct {
		name       string
		reg        prometheus.Registerer
		pol, tgt   string
		wantSubstr string
	}{
		{"invalid UTF-8 policy", prometheus.NewRegistry(), "pay\xffments", "api", `policy "pay\xffments": not valid UTF-8`},
		{"invalid UTF-8 target", prometheus.NewRegistry(), "payments", "\xc3", `target "\xc3": not valid UTF-8`},
		{"empty target", prometheus.NewRegistry(), "payments", "", "target: must not be empty"},
		{"nil registry", nil, "payments", "api", "registerer: must not be nil"},
		{"another collector of the name", other, "payments", "api", "register backstop_client_attempts_total"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			_, err := retry.Do(context.Background(), parse(t, constant), func(context.Context) (int, error) {
				called = true
				return 0, nil
			}, retry.WithMetrics(tc.reg, tc.pol, tc.tgt))
			if err == nil || !strings.Contains(err.Error(), tc.wantSubstr) || called {
				t.Fatalf("Do = %v (called: %v), want an error containing %q before any call", err, called, tc.wantSubstr)
			}
		})
	}
}

var _ = policy.Retry
