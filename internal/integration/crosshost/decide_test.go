package crosshost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/failvalue"
	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

// commands returns the four `decide` commands: the Go one (built here),
// Node's bin/backstop-decide.js, `python -m backstop decide` and Java's
// `java -jar sdk/java/target/backstop-policy.jar decide`, with the
// default policy and --random 0 (a line without random gets 0, as in the
// vectors: the answers depend on the input only).
func commands(t *testing.T) map[string][]string {
	return commandsWith(t, "--policy", "default", "--random", "0")
}

// commandsWith is commands with other flags.
func commandsWith(t *testing.T, flags ...string) map[string][]string {
	t.Helper()
	node := requireTool(t, "node", "Node.js runs sdk/node")
	python := filepath.Join(root, ".venv", "bin", "python")
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s missing: run `make test`, which creates the virtualenv with the Python host", python)
	}
	bin := filepath.Join(t.TempDir(), "backstop")
	if out, err := exec.Command("go", "build", "-o", bin, root+"/cmd/backstop").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return map[string][]string{
		"go":     append([]string{bin, "decide"}, flags...),
		"node":   append([]string{node, filepath.Join(root, "sdk/node/bin/backstop-decide.js")}, flags...),
		"python": append([]string{python, "-m", "backstop", "decide"}, flags...),
		"java":   append(javaDecide(t), flags...),
	}
}

// stream is the input every command gets: each line case of
// testdata/vectors/inputs.json, each once more with a CRLF ending, blank
// lines, lines at and past the length limit, and a last line without "\n".
func stream(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "testdata/vectors/inputs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f vector.InputsFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	for _, c := range f.Cases {
		switch {
		case c.Line != nil:
			lines = append(lines, []byte(*c.Line))
		case c.LineHex != "":
			raw, err := hex.DecodeString(c.LineHex)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, raw)
		}
	}
	// duration_ms, the line's own member (not a failure field): its checks
	// come after an unknown name and before the failure's fields.
	for _, l := range []string{
		`{"attempt":1,"http_status":503,"duration_ms":250}`, `{"attempt":1,"duration_ms":null}`,
		`{"attempt":1,"duration_ms":0}`, `{"attempt":1,"duration_ms":-0}`, `{"attempt":1,"duration_ms":1e3}`,
		`{"attempt":1,"duration_ms":9.0}`, `{"attempt":1,"duration_ms":9223372036854775807}`,
		`{"attempt":1,"duration_ms":-1}`, `{"attempt":1,"duration_ms":-9223372036854775808}`,
		`{"attempt":1,"duration_ms":1.5}`, `{"attempt":1,"duration_ms":-1.5}`, `{"attempt":1,"duration_ms":1e400}`,
		`{"attempt":1,"duration_ms":99999999999999999999}`, `{"attempt":1,"duration_ms":-9223372036854775809}`,
		`{"attempt":1,"duration_ms":"10"}`, `{"attempt":1,"duration_ms":true}`, `{"attempt":1,"duration_ms":[]}`,
		`{"attempt":1,"duration_ms":{}}`, `{"attempt":"x","duration_ms":-1}`, `{"attempt":0,"duration_ms":5}`,
		`{"zz":1,"duration_ms":-1}`, `{"attempt":1,"now_ms":"x","duration_ms":5}`, `{"attempt":1,"now_ms":-5,"duration_ms":5}`,
		`{"attempt":1,"now_ms":1.5,"duration_ms":5}`, `{"duration_ms":5}`,
	} {
		lines = append(lines, []byte(l))
	}
	var s bytes.Buffer
	for _, l := range lines {
		s.Write(l)
		s.WriteByte('\n')
	}
	for _, l := range lines {
		s.Write(l)
		s.WriteString("\r\n")
	}
	const failure = `{"attempt":1,"http_status":503}`
	atLimit := failure + strings.Repeat(" ", vector.MaxLineBytes-len(failure))
	for _, l := range []string{"", "\r", " \t", atLimit, atLimit + " ", strings.Repeat("[", 2*vector.MaxLineBytes), failure, "\r"} {
		s.WriteString(l)
		s.WriteByte('\n')
	}
	s.WriteString(`{"attempt":2,"http_status":503,"random":0.5}`) // no "\n"
	return s.Bytes()
}

// defaultPolicy loads the preset "default" into a Go host of its own,
// closed when t ends.
func defaultPolicy(t *testing.T) *host.Policy {
	t.Helper()
	ctx := context.Background()
	rt, err := host.New(ctx, host.WithPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	p, err := rt.Load(ctx, []byte("default"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// reference answers a stream as the contract says, line by line, with the
// Go host in this process.
func reference(t *testing.T, in []byte) []byte {
	t.Helper()
	ctx := context.Background()
	p := defaultPolicy(t)
	lines := bytes.Split(in, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1] // the input ended with "\n"
	}
	var out bytes.Buffer
	for _, l := range lines {
		var d policy.Decision
		in, dur, err := vector.DecodeCallLine(l)
		if dur.Record {
			if rerr := p.RecordDuration(ctx, dur.NowMs, dur.Ms); rerr != nil {
				err = rerr
			}
		}
		if err == nil {
			d, err = p.Decide(ctx, in.Failure())
		}
		out.Write(vector.Answer(d, err))
	}
	return out.Bytes()
}

// The three commands answer the same stream with the same bytes: one line
// per input line, whatever the line.
func TestDecideCommandsAgree(t *testing.T) {
	cmds := commands(t)
	in := stream(t)
	want := reference(t, in)
	wantLines := bytes.Count(in, []byte("\n")) + 1 // the last line has no "\n"
	if n := bytes.Count(want, []byte("\n")); n != wantLines {
		t.Fatalf("the reference has %d answers for %d lines", n, wantLines)
	}
	for name, argv := range cmds {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Stdin = bytes.NewReader(in)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			got, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			if bytes.Equal(got, want) {
				return
			}
			g, w := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
			t.Errorf("%d answer lines, want %d", len(g)-1, len(w)-1)
			for i, diffs := 0, 0; i < min(len(g), len(w)) && diffs < 5; i++ {
				if !bytes.Equal(g[i], w[i]) {
					diffs++
					t.Errorf("line %d:\n got %.300s\nwant %.300s", i, g[i], w[i])
				}
			}
		})
	}
}

// Without --random, each command draws the random of a line that sets
// none (or sets null), one draw a line: under the default policy's full
// jitter (up to 1 s on attempt 1) the delays vary within [0, 1000). With
// --random X every such line gets X: the answers are the Go host's for
// random X. A --random outside [0, 1) is a usage error (exit status 2).
func TestDecideCommandsDrawAbsentRandom(t *testing.T) {
	var in bytes.Buffer
	for i := 0; i < 20; i++ {
		in.WriteString(`{"attempt":1,"http_status":503}` + "\n")
		in.WriteString(`{"attempt":1,"http_status":503,"random":null}` + "\n")
	}
	run := func(t *testing.T, argv []string) ([]vector.Expect, error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdin = bytes.NewReader(in.Bytes())
		out, err := cmd.Output()
		var got []vector.Expect
		for _, l := range bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n")) {
			var e vector.Expect
			if json.Unmarshal(l, &e) == nil {
				got = append(got, e)
			}
		}
		return got, err
	}
	ctx := context.Background()
	p := defaultPolicy(t)
	atHalf, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, Random: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	for name, argv := range commandsWith(t, "--policy", "default") {
		t.Run(name, func(t *testing.T) {
			got, err := run(t, argv)
			if err != nil || len(got) != 40 {
				t.Fatalf("%d answers for 40 lines, %v", len(got), err)
			}
			delays := map[int64]bool{}
			for i, e := range got {
				if e.Action != "retry" || e.DelayMs < 0 || e.DelayMs >= 1000 {
					t.Errorf("line %d: %+v, want a retry after [0, 1000) ms", i, e)
				}
				delays[e.DelayMs] = true
			}
			if len(delays) < 2 {
				t.Errorf("40 lines without random got the delays %v: no draw", delays)
			}
		})
	}
	for name, argv := range commandsWith(t, "--policy", "default", "--random", "0.5") {
		t.Run(name+"/--random 0.5", func(t *testing.T) {
			got, err := run(t, argv)
			if err != nil || len(got) != 40 {
				t.Fatalf("%d answers for 40 lines, %v", len(got), err)
			}
			for i, e := range got {
				if e.Action != atHalf.Action.String() || e.DelayMs != atHalf.DelayMs {
					t.Errorf("line %d: %+v, want %s after %d ms (random 0.5)", i, e, atHalf.Action, atHalf.DelayMs)
				}
			}
		})
	}
	for _, bad := range []string{"1", "-0.1", "x", "NaN"} {
		for name, argv := range commandsWith(t, "--random", bad) {
			t.Run(name+"/--random "+bad, func(t *testing.T) {
				_, err := run(t, argv)
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 2 {
					t.Errorf("--random %s: %v, want exit status 2", bad, err)
				}
			})
		}
	}
}

// Each command answers a line before the next one is written (a
// co-process waits for each answer), blank and bad lines included.
func TestDecideCommandsAnswerBeforeWaiting(t *testing.T) {
	lines := []string{`{"attempt":1,"http_status":503}`, "", "\r", "not json", "{\"attempt\":2,\"method\":\"\xff\"}", `{"attempt":0}`, `{"attempt":2}`}
	for name, argv := range commands(t) {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(argv[0], argv[1:]...)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer stdin.Close()
			answers := bufio.NewReader(stdout)
			for _, l := range lines {
				io.WriteString(stdin, l+"\n")
				got := make(chan string, 1)
				go func() {
					s, _ := answers.ReadString('\n')
					got <- s
				}()
				select {
				case s := <-got:
					if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}\n") {
						t.Fatalf("answer to %q: %q", l, s)
					}
				case <-time.After(time.Minute): // a deadlock guard, not a timing check
					cmd.Process.Kill()
					t.Fatalf("no answer to %q: the command waits for more input first", l)
				}
			}
		})
	}
}

// randomDouble is the i-th of the number tests' doubles: by turns any bit
// pattern, a fraction at a random scale, and a large dyadic number.
func randomDouble(rng *rand.Rand, i int) float64 {
	switch i % 3 {
	case 0:
		return math.Float64frombits(rng.Uint64())
	case 1:
		return rng.Float64() * math.Pow(10, float64(rng.IntN(60)-30))
	default:
		return float64(rng.Int64N(1<<62)) / float64(int64(1)<<rng.IntN(62))
	}
}

// Messages show numbers as JavaScript prints them: Go (failvalue.ESFormat,
// which writes them for every host since the core reads failure values)
// writes every double as Node.js does.
func TestNumbersPrintAlike(t *testing.T) {
	node := requireTool(t, "node", "Node.js runs sdk/node")
	rng := rand.New(rand.NewPCG(7, 8))
	var in bytes.Buffer
	var want []string
	for i := 0; i < 3000; i++ {
		f := randomDouble(rng, i)
		fmt.Fprintf(&in, "%016x\n", math.Float64bits(f))
		want = append(want, failvalue.ESFormat(f))
	}
	for name, argv := range map[string][]string{
		"node": {node, "-e", `const b = Buffer.alloc(8); const out = require('fs').readFileSync(0, 'utf8').trim().split('\n').map((h) => { b.write(h, 'hex'); return String(b.readDoubleBE(0)); }); process.stdout.write(out.join('\n') + '\n');`},
	} {
		got := run(t, in.Bytes(), argv[0], argv[1:]...)
		if len(got) != len(want) {
			t.Fatalf("%s printed %d numbers for %d", name, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s prints %s, Go %s", name, got[i], want[i])
			}
		}
	}
}

// The commands show a number in a message as JavaScript prints it, so
// 3,000 random doubles as http_status (refused: not a 32-bit integer) give
// every command the same error lines, the Go command's (failvalue.ESFormat).
// TestNumbersPrintAlike checks Go's formatter against Node.js's directly;
// this checks each command's.
func TestDecideCommandsPrintNumbersAlike(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var in bytes.Buffer
	for i := 0; i < 3000; i++ {
		f := randomDouble(rng, i)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			f = 0.5
		}
		// An exponent keeps every reader from taking it for an integer.
		fmt.Fprintf(&in, `{"attempt":1,"http_status":%s}`+"\n", strconv.FormatFloat(f, 'e', -1, 64))
	}
	cmds := commands(t)
	want := run(t, in.Bytes(), cmds["go"][0], cmds["go"][1:]...)
	if !strings.Contains(strings.Join(want, "\n"), "must be a 32-bit integer (got ") {
		t.Fatalf("the Go command refused none of the numbers: %.300s", want)
	}
	for name, argv := range cmds {
		if name == "go" {
			continue
		}
		got := run(t, in.Bytes(), argv[0], argv[1:]...)
		if len(got) != len(want) {
			t.Fatalf("%s answered %d lines for %d", name, len(got), len(want))
		}
		diffs := 0
		for i := range want {
			if got[i] != want[i] {
				if diffs++; diffs <= 5 {
					t.Errorf("%s, line %d:\n got %s\nwant %s", name, i, got[i], want[i])
				}
			}
		}
	}
}
