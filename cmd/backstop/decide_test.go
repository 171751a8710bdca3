package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/vector"
)

// sharedLines returns the line cases of testdata/vectors/inputs.json as
// one input stream, and the answer lines expected for it.
func sharedLines(t *testing.T) (stdin string, want []string) {
	t.Helper()
	b, err := os.ReadFile("../../testdata/vectors/inputs.json")
	if err != nil {
		t.Fatal(err)
	}
	var f vector.InputsFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for _, c := range f.Cases {
		switch {
		case c.Line != nil:
			in.WriteString(*c.Line)
		case c.LineHex != "":
			raw, err := hex.DecodeString(c.LineHex)
			if err != nil {
				t.Fatal(err)
			}
			in.Write(raw)
		default:
			continue // a value: the libraries' case
		}
		in.WriteByte('\n')
		want = append(want, c.Output)
	}
	return in.String(), want
}

func lines(out string) []string {
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

// Every shared line case gets its answer, byte for byte, in one stream.
func TestDecideAnswersTheSharedInputLines(t *testing.T) {
	stdin, want := sharedLines(t)
	out, err := runCLI(t, stdin, "decide", "--policy", "default")
	if err != nil {
		t.Fatal(err)
	}
	got := lines(out)
	if len(got) != len(want) {
		t.Fatalf("%d answers for %d lines", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %.300s\nwant %.300s", i, got[i], want[i])
		}
	}
}

// One output line per input line: blank lines, CRLF, a last line without
// "\n", and nothing at all for empty input.
func TestDecideAnswersEveryLine(t *testing.T) {
	const retry = `{"action":"retry","delay_ms":0,"reason":"transient","class":"retryable"}`
	const blank = `{"error":"invalid input line: empty"}`
	const last = `{"action":"dead_letter","delay_ms":0,"reason":"uncertain_limit_reached","class":"uncertain"}`
	cases := []struct {
		in   string
		want []string
	}{
		{"{\"attempt\":1,\"http_status\":503,\"random\":0}\n\n", []string{retry, blank}}, // the example (with random: its answer is fixed)
		{"\n", []string{blank}},
		{"\n\n\n", []string{blank, blank, blank}},
		{"{\"attempt\":1,\"http_status\":503,\"random\":0}\r\n\r\n{\"attempt\":2}\r\n", []string{retry, blank, last}},
	}
	// The cases above end with "\n": one stream holds them all. The ones
	// below end without it, each in a stream of its own.
	all := cases[0]
	for _, c := range cases[1:] {
		all.in += c.in
		all.want = append(all.want, c.want...)
	}
	for _, c := range []struct {
		in   string
		want []string
	}{
		all,
		{"{\"attempt\":1,\"http_status\":503,\"random\":0}\n{\"attempt\":2}", []string{retry, last}},
		{"\n  ", []string{blank, blank}},
		{"\r", []string{blank}},
	} {
		out, err := runCLI(t, c.in, "decide")
		if err != nil {
			t.Fatal(err)
		}
		if got := lines(out); strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%q:\n got %q\nwant %q", c.in, got, c.want)
		}
	}
	if out, err := runCLI(t, "", "decide"); err != nil || out != "" {
		t.Errorf("empty input: %q, %v", out, err)
	}
}

// A line longer than the limit gets one error line, is not buffered, and
// the stream goes on; a line at the limit is decided.
func TestDecideLongLines(t *testing.T) {
	const failure = `{"attempt":1,"http_status":503,"random":0}`
	atLimit := failure + strings.Repeat(" ", vector.MaxLineBytes-len(failure))
	over := atLimit + " "
	tooLong := `{"error":"invalid input line: longer than 4194304 bytes"}`
	retry := `{"action":"retry","delay_ms":0,"reason":"transient","class":"retryable"}`
	in := atLimit + "\n" + over + "\n" + failure + "\n" + strings.Repeat("x", 3*vector.MaxLineBytes) + "\n" + over
	out, err := runCLI(t, in, "decide")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{retry, tooLong, retry, tooLong, tooLong}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// A process that writes one line and waits gets its answer, blank lines
// included: decide never holds an answer while it waits for input.
func TestDecideAnswersBeforeWaiting(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"decide"}, inR, outW, io.Discard)
		outW.Close()
	}()
	answers := bufio.NewReader(outR)
	for _, line := range []string{`{"attempt":1,"http_status":503}`, "", "garbage", "   \r", `{"attempt":2}`} {
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatal(err)
		}
		got := make(chan string, 1)
		go func() {
			s, _ := answers.ReadString('\n')
			got <- s
		}()
		select {
		case s := <-got:
			if !strings.HasPrefix(s, "{") {
				t.Fatalf("answer to %q: %q", line, s)
			}
		case <-time.After(time.Minute): // a deadlock guard, not a timing check
			t.Fatalf("no answer to %q: the command waits for more input first", line)
		}
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A line without random gets a draw of its own: under full jitter (the
// default preset: up to 1s on attempt 1) the delays differ from line to
// line and are not all 0, as they were when an absent random read as 0.
// "random": null is absent too.
func TestDecideDrawsAnAbsentRandom(t *testing.T) {
	var in strings.Builder
	for i := 0; i < 20; i++ {
		in.WriteString(`{"attempt":1,"http_status":503}` + "\n")
		in.WriteString(`{"attempt":1,"http_status":503,"random":null}` + "\n")
	}
	out, err := runCLI(t, in.String(), "decide", "--policy", "default")
	if err != nil {
		t.Fatal(err)
	}
	delays := map[int64]int{}
	for i, l := range lines(out) {
		var e vector.Expect
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Action != "retry" || e.Reason != "transient" {
			t.Fatalf("line %d: %s (%v)", i, l, err)
		}
		if e.DelayMs < 0 || e.DelayMs >= 1000 {
			t.Errorf("line %d: delay %dms outside full jitter's [0, 1000)", i, e.DelayMs)
		}
		delays[e.DelayMs]++
	}
	if len(lines(out)) != 40 {
		t.Fatalf("%d answers for 40 lines", len(lines(out)))
	}
	if len(delays) < 2 {
		t.Errorf("40 lines without random got the delays %v: no draw", delays)
	}
}

// A line with random is answered from it alone: the decision cases of
// testdata/vectors/vectors.json (the first 6 groups that keep no state
// between cases and draw random: one command each, each loading the
// module), written as lines with their random (an explicit 0 when the
// vector leaves it out), get the vector's answers, each line run twice.
func TestDecideWithRandomGivesTheVectors(t *testing.T) {
	b, err := os.ReadFile("../../testdata/vectors/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var f vector.File
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	checked, groups := 0, 0
	for gi, g := range f.Groups {
		if g.Stateful || groups == 6 || !bytes.Contains(must(json.Marshal(g.Cases)), []byte(`"random":`)) {
			continue
		}
		groups++
		var in strings.Builder
		var want []vector.Expect
		for _, c := range g.Cases {
			if c.Op != "" || c.Input == nil || c.Expect == nil {
				continue
			}
			raw, err := json.Marshal(c.Input)
			if err != nil {
				t.Fatal(err)
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(raw, &fields); err != nil {
				t.Fatal(err)
			}
			if _, ok := fields["random"]; !ok {
				fields["random"] = json.RawMessage("0")
			}
			line, _ := json.Marshal(fields)
			for range 2 {
				in.Write(line)
				in.WriteByte('\n')
				want = append(want, *c.Expect)
			}
		}
		if len(want) == 0 {
			continue
		}
		pol := g.Preset
		if pol == "" {
			pol = filepath.Join(dir, fmt.Sprintf("g%d.json", gi))
			if err := os.WriteFile(pol, g.Policy, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out, err := runCLI(t, in.String(), "decide", "--policy", pol)
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		got := lines(out)
		if len(got) != len(want) {
			t.Fatalf("%s: %d answers for %d lines", g.Name, len(got), len(want))
		}
		for i, l := range got {
			var e vector.Expect
			if err := json.Unmarshal([]byte(l), &e); err != nil || e != want[i] {
				t.Errorf("%s: line %d: got %s, want %+v", g.Name, i, l, want[i])
			}
			checked++
		}
	}
	if checked < 100 {
		t.Errorf("%d vector decisions checked: the vectors moved?", checked)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// A line's duration_ms is recorded before its failure is decided: three
// slow calls that fail permanently, and the fourth, a 503, finds the
// breaker opened by the slow-call rate (without durations it retries).
func TestDecideRecordsDurations(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "slow.yaml")
	os.WriteFile(policy, []byte(`circuit_breaker: {type: failure_rate, slow_call_rate_threshold: 50, slow_call_duration_threshold: 100ms, sliding_window: {type: count, size: 4}, minimum_calls: 4, open_for: 30s}`), 0o644)
	stdin := `{"attempt":1,"http_status":400,"now_ms":1000,"duration_ms":500}
{"attempt":1,"http_status":400,"now_ms":1001,"duration_ms":500}
{"attempt":1,"http_status":400,"now_ms":1002,"duration_ms":-1}
{"attempt":1,"http_status":400,"now_ms":1003,"duration_ms":500}
{"attempt":1,"http_status":503,"now_ms":1004,"duration_ms":500}
`
	out, err := runCLI(t, stdin, "decide", "--policy", policy, "--random", "0")
	if err != nil {
		t.Fatal(err)
	}
	got := lines(out)
	if len(got) != 5 || got[2] != `{"error":"duration_ms: must be >= 0 (got -1)"}` ||
		got[4] != `{"action":"dead_letter","delay_ms":0,"reason":"circuit_open","class":"retryable"}` {
		t.Errorf("answers:\n%s", out)
	}
}
