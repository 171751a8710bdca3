package retry_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/casetest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// The shared layer cases (testdata/layers/README.md): real HTTP servers on
// loopback, a scripted bottom, a middle wrapped in retry.Middleware whose
// handler calls the bottom through retry.Do, and a top retry.Do. This Go
// replay regenerates the file (-update); without -update it checks it.

const layersFile = "../testdata/layers/cases.json"

type layerFile struct {
	Comment string          `json:"comment"`
	Policy  json.RawMessage `json:"policy"`
	Cases   []layerCase     `json:"cases"`
}

type layerCase struct {
	Name      string          `json:"name"`
	Policy    json.RawMessage `json:"policy,omitempty"`
	InnerLoop bool            `json:"inner_loop,omitempty"`
	Bottom    []layerResponse `json:"bottom"`
	Middle    *layerMiddle    `json:"middle,omitempty"`
	Expect    layerExpect     `json:"expect"`
}

type layerResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
}

type layerMiddle struct {
	BreakerOpen bool            `json:"breaker_open,omitempty"`
	Policy      json.RawMessage `json:"policy,omitempty"`
}

type layerExpect struct {
	Reason        string              `json:"reason"`
	Attempts      int                 `json:"attempts"`
	BottomCalls   int                 `json:"bottom_calls"`
	MiddleCalls   int                 `json:"middle_calls,omitempty"`
	BottomSeen    []map[string]string `json:"bottom_seen,omitempty"`
	MiddleHeaders map[string]string   `json:"middle_headers,omitempty"`
}

// seenHeaders are the request headers the bottom records.
var seenHeaders = []string{"backstop-attempt", "x-envoy-attempt-count"}

// signalHeaders are the middle's response headers a case looks at.
var signalHeaders = []string{"backstop-no-retry", "x-envoy-overloaded"}

// scripted is the bottom: it answers its responses in order, the last one
// again after, and records the attempt headers of each call.
type scripted struct {
	mu    sync.Mutex
	resps []layerResponse
	seen  []map[string]string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := len(s.seen)
	seen := map[string]string{}
	for _, h := range seenHeaders {
		if v := r.Header.Get(h); v != "" {
			seen[h] = v
		}
	}
	s.seen = append(s.seen, seen)
	s.mu.Unlock()
	resp := s.resps[min(n, len(s.resps)-1)]
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	w.WriteHeader(resp.Status)
}

func parseJSON(t *testing.T, raw json.RawMessage) *policy.Policy {
	t.Helper()
	p, err := policy.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// get calls url through retry.Do with p, the attempt headers on.
func get(ctx context.Context, p backstop.Decider, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return retry.Do(ctx, p, func(context.Context) (*http.Response, error) {
		return http.DefaultClient.Do(req)
	}, retry.WithRequest(req))
}

func drain(r *http.Response) {
	if r != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
}

// startMiddle serves the middle: retry.Middleware with its policy as its
// one policy; the handler calls the bottom through retry.Do and answers
// 200, or the status of the bottom's last response when the loop gave up
// (503 when it made no call).
func startMiddle(t *testing.T, file *layerFile, c *layerCase, bottomURL string) (*httptest.Server, *int) {
	raw := c.Middle.Policy
	if raw == nil {
		raw = file.Policy
	}
	if c.Middle.BreakerOpen {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		m["circuit_breaker"] = map[string]any{"failure_threshold": 1, "open_for": "1h"}
		raw, _ = json.Marshal(m)
	}
	np := parseJSON(t, raw)
	if c.Middle.BreakerOpen {
		np.Decide(policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: time.Now().UnixMilli()})
	}
	p := backstop.Native(np)
	var mu sync.Mutex
	calls := new(int)
	handler := retry.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := get(r.Context(), p, bottomURL)
		defer drain(resp)
		switch {
		case err == nil:
			w.WriteHeader(http.StatusOK)
		case resp != nil:
			w.WriteHeader(resp.StatusCode)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}), p)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*calls++
		mu.Unlock()
		handler.ServeHTTP(w, r)
	}))
	return srv, calls
}

func runLayerCase(t *testing.T, file *layerFile, c *layerCase) layerExpect {
	ctx := context.Background()
	bottom := &scripted{resps: c.Bottom}
	bsrv := httptest.NewServer(bottom)
	defer bsrv.Close()
	url := bsrv.URL
	var middleCalls *int
	if c.Middle != nil {
		msrv, calls := startMiddle(t, file, c, bsrv.URL)
		defer msrv.Close()
		url, middleCalls = msrv.URL, calls
	}
	raw := c.Policy
	if raw == nil {
		raw = file.Policy
	}
	top := backstop.Native(parseJSON(t, raw))
	inner := backstop.Native(parseJSON(t, file.Policy))

	var got layerExpect
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := retry.Do(ctx, top, func(ctx context.Context) (*http.Response, error) {
		got.Attempts++
		if c.InnerLoop { // a second loop in the same process, its own request
			return get(ctx, inner, url)
		}
		r, err := http.DefaultClient.Do(req)
		if err == nil && c.Middle != nil {
			got.MiddleHeaders = map[string]string{}
			for _, h := range signalHeaders {
				if v := r.Header.Get(h); v != "" {
					got.MiddleHeaders[h] = v
				}
			}
		}
		return r, err
	}, retry.WithRequest(req))
	drain(resp)
	got.Reason = "success"
	var re *retry.Error
	switch {
	case errors.As(err, &re):
		got.Reason = re.Reason.String()
	case err != nil:
		t.Fatalf("case %s: %v", c.Name, err)
	}
	bottom.mu.Lock()
	got.BottomCalls, got.BottomSeen = len(bottom.seen), bottom.seen
	bottom.mu.Unlock()
	if middleCalls != nil {
		got.MiddleCalls = *middleCalls
	}
	if len(got.MiddleHeaders) == 0 {
		got.MiddleHeaders = nil
	}
	return got
}

func TestLayerCases(t *testing.T) {
	var file layerFile
	if *update {
		file = layerFile{
			Comment: "generated by `make layers-cases` (retry/layers_test.go); see README.md",
			Policy:  json.RawMessage(layerPolicy), Cases: buildLayerCases(),
		}
	} else {
		casetest.Read(t, layersFile, &file)
	}
	casetest.UniqueNames(t, file.Cases, func(c layerCase) string { return c.Name })
	for i := range file.Cases {
		c := &file.Cases[i]
		got := runLayerCase(t, &file, c)
		if *update {
			c.Expect = got
			continue
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(c.Expect)
		if string(g) != string(w) {
			t.Errorf("case %s:\n got  %s\n want %s", c.Name, g, w)
		}
	}
	if *update {
		casetest.Write(t, layersFile, file)
		return
	}
	if len(file.Cases) == 0 {
		t.Fatal("no layer cases")
	}
}

// The rule the cases pin, read off them: with three layers of three
// attempts, the bottom service sees the one layer's attempts, not 27.
func TestLayerCasesBoundTheBottom(t *testing.T) {
	var file layerFile
	casetest.Read(t, layersFile, &file)
	var p struct {
		MaxAttempts int `json:"max_attempts"`
	}
	if err := json.Unmarshal(file.Policy, &p); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, c := range file.Cases {
		if !strings.HasPrefix(c.Name, "layers/3") && !strings.HasPrefix(c.Name, "nested/") || strings.Contains(c.Name, "opt-in") {
			continue
		}
		checked++
		if c.Expect.BottomCalls > p.MaxAttempts {
			t.Errorf("case %s: the bottom saw %d calls, more than one layer's %d attempts", c.Name, c.Expect.BottomCalls, p.MaxAttempts)
		}
		if c.Expect.Attempts > 1 && c.Expect.Reason != "success" {
			t.Errorf("case %s: the top loop made %d attempts at a failure a layer below gave up", c.Name, c.Expect.Attempts)
		}
	}
	if checked == 0 {
		t.Fatal("no layered case to check")
	}
}
