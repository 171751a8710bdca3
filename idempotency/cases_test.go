package idempotency

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/casetest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// testdata/idempotency/cases.json: the shared cases every adapter replays
// (README.md there). -update regenerates it from the Go store; without it
// the Go store must reproduce it.
var updateCases = flag.Bool("update", false, "regenerate testdata/idempotency/cases.json from the Go store")

const casesFile = "../testdata/idempotency/cases.json"

type caseFile struct {
	Comment     string     `json:"comment"`
	Scope       string     `json:"scope"`
	Key         string     `json:"key"`
	LeaseMS     int64      `json:"lease_ms"`
	RetentionMS int64      `json:"retention_ms"`
	MaxBody     int        `json:"max_body"`
	Cases       []idemCase `json:"cases"`
}

type idemCase struct {
	Name  string         `json:"name"`
	Steps []caseStep     `json:"steps"`
	Want  []any          `json:"replies"`
	Final map[string]any `json:"final"`
}

type caseStep struct {
	Caller  string              `json:"caller,omitempty"`
	Op      string              `json:"op"`
	Request string              `json:"request,omitempty"`
	Status  int                 `json:"status,omitempty"`
	Headers map[string][]string `json:"headers,omitempty"`
	Body    string              `json:"body_b64,omitempty"`
	// Truncated: complete's response was cut short (the client left).
	Truncated bool `json:"truncated,omitempty"`
	// Fields: write's record, as an adapter may have stored it.
	Fields map[string]string `json:"fields,omitempty"`
}

// replayCase runs c's steps through a store and returns each step's reply
// and the record after, normalised (see README.md): owners by caller name,
// times relative to the server clock in whole seconds, headers parsed.
func replayCase(t *testing.T, ctx context.Context, rdb redis.UniversalClient, f *caseFile, c *idemCase) ([]any, map[string]any) {
	t.Helper()
	s := New(rdb, WithLease(time.Duration(f.LeaseMS)*time.Millisecond), WithRetention(time.Duration(f.RetentionMS)*time.Millisecond),
		WithMaxBody(f.MaxBody), WithMetrics(NewMetrics()))
	rk := s.RecordKey(f.Scope, f.Key)
	if err := rdb.Del(ctx, rk).Err(); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	var replies []any
	for _, st := range c.Steps {
		var reply any
		switch st.Op {
		case "begin":
			cl, err := s.Begin(ctx, f.Scope, f.Key, st.Request)
			if err != nil {
				t.Fatalf("case %s: begin: %v", c.Name, err)
			}
			r := map[string]any{"state": cl.State.String()}
			switch cl.State {
			case Started:
				tokens[st.Caller] = cl.Token
				r["taken_over"] = cl.TakenOver
			case InProgress:
				r["retry_after_s"] = int(cl.RetryAfter / time.Second)
			case Completed:
				r["status"], r["headers"], r["too_large"] = cl.Response.Status, cl.Response.Headers, cl.Response.TooLarge
				r["body_b64"] = base64.StdEncoding.EncodeToString(cl.Response.Body)
				if cl.Response.Truncated {
					r["truncated"] = true
				}
			}
			reply = r
		case "complete", "fail":
			body, _ := base64.StdEncoding.DecodeString(st.Body)
			tok := tokens[st.Caller]
			if tok == "" {
				tok = "never-begun-" + st.Caller
			}
			var err error
			if st.Op == "complete" {
				err = s.Complete(ctx, f.Scope, f.Key, tok, Response{Status: st.Status, Headers: st.Headers, Body: body, Truncated: st.Truncated})
			} else {
				err = s.Fail(ctx, f.Scope, f.Key, tok)
			}
			switch {
			case err == nil:
				reply = map[string]any{"ok": true}
			case errors.Is(err, ErrLeaseLost):
				reply = map[string]any{"error": "lease_lost"}
			default:
				t.Fatalf("case %s: %s: %v", c.Name, st.Op, err)
			}
		case "lapse":
			// A second before the server's now: the lease has run out.
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.HSet(ctx, rk, "lease_until", now.UnixMilli()-1000).Err(); err != nil {
				t.Fatal(err)
			}
		case "expire":
			if err := rdb.Del(ctx, rk).Err(); err != nil {
				t.Fatal(err)
			}
		case "write":
			// A record as it is in Redis, written by another adapter or
			// an older version, kept for the retention.
			if err := rdb.HSet(ctx, rk, st.Fields).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.PExpire(ctx, rk, time.Duration(f.RetentionMS)*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("case %s: unknown op %q", c.Name, st.Op)
		}
		if reply != nil {
			replies = append(replies, reply)
		}
	}
	return normalise(replies), recordState(t, ctx, rdb, rk, tokens)
}

// recordState is the record as the cases compare it.
func recordState(t *testing.T, ctx context.Context, rdb redis.UniversalClient, rk string, tokens map[string]string) map[string]any {
	h, err := rdb.HGetAll(ctx, rk).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(h) == 0 {
		return nil
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for k, v := range h {
		out[k] = v
	}
	for caller, tok := range tokens {
		if h["token"] == tok {
			out["token"] = "{" + caller + "}"
		}
	}
	if v, ok := h["lease_until"]; ok {
		var ms int64
		fmt.Sscan(v, &ms)
		out["lease_until"] = fmt.Sprintf("{now%+ds}", int64(math.Round(float64(ms-now.UnixMilli())/1000)))
	}
	if v, ok := h["headers"]; ok && v != "" {
		var parsed any
		if err := json.Unmarshal([]byte(v), &parsed); err != nil {
			t.Fatalf("headers %q: %v", v, err)
		}
		out["headers"] = parsed
	}
	ttl, err := rdb.PTTL(ctx, rk).Result()
	if err != nil {
		t.Fatal(err)
	}
	out["ttl_s"] = int64(math.Round(ttl.Seconds()))
	return out
}

// normalise passes v through JSON, as the other languages read the file.
func normalise(v []any) []any {
	b, _ := json.Marshal(v)
	var out []any
	json.Unmarshal(b, &out)
	return out
}

func TestIdempotencyCases(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	var file caseFile
	if *updateCases {
		file = caseFile{Comment: "generated by `make idempotency-cases` (idempotency/cases_test.go); see README.md",
			Scope: "POST /charges", Key: "key-1", LeaseMS: 30000, RetentionMS: 86400000, MaxBody: 1024, Cases: buildCases()}
	} else {
		casetest.Read(t, casesFile, &file)
	}
	run := func(t *testing.T, rdb redis.UniversalClient) {
		casetest.UniqueNames(t, file.Cases, func(c idemCase) string { return c.Name })
		for i := range file.Cases {
			c := &file.Cases[i]
			replies, final := replayCase(t, ctx, rdb, &file, c)
			if *updateCases {
				c.Want, c.Final = replies, final
				continue
			}
			got, _ := json.Marshal([]any{replies, final})
			want, _ := json.Marshal([]any{c.Want, c.Final})
			if string(got) != string(want) {
				t.Errorf("case %s:\n got  %s\n want %s", c.Name, got, want)
			}
		}
	}
	run(t, rdb)
	if *updateCases {
		casetest.Write(t, casesFile, file)
		return
	}
	if len(file.Cases) < 30 {
		t.Errorf("%d cases, want at least 30", len(file.Cases))
	}
	// On a Redis Cluster too: the record is one key, so each call runs on
	// the node that owns it.
	t.Run("cluster", func(t *testing.T) { run(t, redistest.StartCluster(t, 3).Client(t)) })
}
