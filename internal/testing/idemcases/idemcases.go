// Package idemcases replays testdata/idempotency (the shared cases every
// idempotency backend and language answers the same way) through any
// idempotency.Backend. A backend's test supplies a Raw: the few steps that
// reach under the store (a lapsed lease, an expired record, a record
// written by another adapter) and the record as the cases compare it.
package idemcases

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/idempotency"
)

// Path is the case file, from a package directory one level below the
// repository's root; RootPath from two levels.
const (
	Path     = "../testdata/idempotency/cases.json"
	RootPath = "../../testdata/idempotency/cases.json"
)

// File is testdata/idempotency/cases.json.
type File struct {
	Comment     string `json:"comment"`
	Scope       string `json:"scope"`
	Key         string `json:"key"`
	LeaseMS     int64  `json:"lease_ms"`
	RetentionMS int64  `json:"retention_ms"`
	MaxBody     int    `json:"max_body"`
	Cases       []Case `json:"cases"`
}

// Options are the store options the file sets, with fresh metrics.
func (f *File) Options() []idempotency.Option {
	return []idempotency.Option{idempotency.WithLease(time.Duration(f.LeaseMS) * time.Millisecond),
		idempotency.WithRetention(time.Duration(f.RetentionMS) * time.Millisecond),
		idempotency.WithMaxBody(f.MaxBody), idempotency.WithMetrics(idempotency.NewMetrics())}
}

// Case is one sequence of steps on the file's key.
type Case struct {
	Name  string         `json:"name"`
	Steps []Step         `json:"steps"`
	Want  []any          `json:"replies"`
	Final map[string]any `json:"final"`
}

// Step is one step (README.md there, "Steps").
type Step struct {
	Caller  string              `json:"caller,omitempty"`
	Op      string              `json:"op"`
	Request string              `json:"request,omitempty"`
	Status  int                 `json:"status,omitempty"`
	Headers map[string][]string `json:"headers,omitempty"`
	Body    string              `json:"body_b64,omitempty"`
	// Truncated: complete's response was cut short (the client left).
	Truncated bool `json:"truncated,omitempty"`
	// Fields: write's record, as an adapter may have stored it (the
	// fields of the Redis hash).
	Fields map[string]string `json:"fields,omitempty"`
}

// Raw reaches under a store for the steps that are not store calls.
type Raw interface {
	// Reset removes the record (before a case).
	Reset(ctx context.Context) error
	// Lapse sets the end of the owner's lease a second before the
	// server's clock.
	Lapse(ctx context.Context) error
	// Expire ends the record's retention.
	Expire(ctx context.Context) error
	// Write stores a record given as the fields of the Redis hash, kept
	// for the retention.
	Write(ctx context.Context, fields map[string]string) error
	// Record is the record as the cases compare it (README.md there, "The
	// record after"): nil when absent, else its fields as strings, owners
	// by caller name (tokens: caller → token), lease_until as "{now+Ns}",
	// headers parsed, ttl_s.
	Record(ctx context.Context, tokens map[string]string) (map[string]any, error)
}

// Replay runs c's steps through store and raw and returns each step's
// reply and the record after, normalised through JSON.
func Replay(t testing.TB, ctx context.Context, store idempotency.Backend, raw Raw, f *File, c *Case) ([]any, map[string]any) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
	}
	must(raw.Reset(ctx))
	tokens := map[string]string{}
	var replies []any
	for _, st := range c.Steps {
		var reply any
		switch st.Op {
		case "begin":
			cl, err := store.Begin(ctx, f.Scope, f.Key, st.Request)
			if err != nil {
				t.Fatalf("case %s: begin: %v", c.Name, err)
			}
			r := map[string]any{"state": cl.State.String()}
			switch cl.State {
			case idempotency.Started:
				tokens[st.Caller] = cl.Token
				r["taken_over"] = cl.TakenOver
			case idempotency.InProgress:
				r["retry_after_s"] = int(cl.RetryAfter / time.Second)
			case idempotency.Completed:
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
				err = store.Complete(ctx, f.Scope, f.Key, tok, idempotency.Response{Status: st.Status, Headers: st.Headers, Body: body, Truncated: st.Truncated})
			} else {
				err = store.Fail(ctx, f.Scope, f.Key, tok)
			}
			switch {
			case err == nil:
				reply = map[string]any{"ok": true}
			case errors.Is(err, idempotency.ErrLeaseLost):
				reply = map[string]any{"error": "lease_lost"}
			default:
				t.Fatalf("case %s: %s: %v", c.Name, st.Op, err)
			}
		case "lapse":
			must(raw.Lapse(ctx))
		case "expire":
			must(raw.Expire(ctx))
		case "write":
			must(raw.Write(ctx, st.Fields))
		default:
			t.Fatalf("case %s: unknown op %q", c.Name, st.Op)
		}
		if reply != nil {
			replies = append(replies, reply)
		}
	}
	final, err := raw.Record(ctx, tokens)
	must(err)
	return normalise(replies), final
}

// normalise passes v through JSON, as the other languages read the file.
func normalise(v []any) []any {
	b, _ := json.Marshal(v)
	var out []any
	json.Unmarshal(b, &out)
	return out
}

// Compare replays every case of f and reports each one whose replies or
// record differ from the file's.
func Compare(t *testing.T, ctx context.Context, store idempotency.Backend, raw Raw, f *File) {
	t.Helper()
	if len(f.Cases) < 30 {
		t.Errorf("%d cases, want at least 30", len(f.Cases))
	}
	for i := range f.Cases {
		c := &f.Cases[i]
		replies, final := Replay(t, ctx, store, raw, f, c)
		got, _ := json.Marshal([]any{replies, final})
		want, _ := json.Marshal([]any{c.Want, c.Final})
		if string(got) != string(want) {
			t.Errorf("case %s:\n got  %s\n want %s", c.Name, got, want)
		}
	}
}
