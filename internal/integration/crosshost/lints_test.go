package crosshost

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// lintLine is a lint as every host's decide command warns of it on stderr,
// whatever wraps it there (Node.js's process warning, Python's
// LintWarning, Java's System.Logger, Go's "warning: "):
// "<field>: <code>: <message>".
var lintLine = regexp.MustCompile(`(?m)([a-z_.]+): (BP\d{3}): (.+)$`)

// TestAllHostsReportTheSameLints loads each policy of
// testdata/lints/cases.json into the four decide commands (no failures on
// stdin) and requires each to warn of exactly the case's lints: the module
// reports bits, and each host spells them out from its own generated copy
// of the schema's table.
func TestAllHostsReportTheSameLints(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "testdata/lints/cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []struct {
			Name   string          `json:"name"`
			Policy json.RawMessage `json:"policy"`
			Lints  []struct {
				Code, Field, Message string
			} `json:"lints"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &file); err != nil || len(file.Cases) == 0 {
		t.Fatalf("%d cases: %v", len(file.Cases), err)
	}
	// Each host's own suite loads every case (host/lints_test.go, Node's
	// lints.test.js, Python's test_lints.py, Java's LintsTest); here a
	// process per case and host, so only those that fire several lints and
	// the first a lint_ignore silences: the decide commands' path.
	cases := file.Cases[:0]
	ignored := false
	for _, c := range file.Cases {
		if len(c.Lints) >= 2 || (!ignored && strings.HasPrefix(c.Name, "ignored:")) {
			ignored = ignored || strings.HasPrefix(c.Name, "ignored:")
			cases = append(cases, c)
		}
	}
	if len(cases) < 3 {
		t.Fatalf("%d cases with several lints or an ignored one", len(cases))
	}
	file.Cases = cases
	cmds := commandsWith(t)
	dir := t.TempDir()
	args := make([]string, len(file.Cases))
	for i, c := range file.Cases {
		args[i] = filepath.Join(dir, fmt.Sprintf("case%d.json", i))
		var preset string
		if json.Unmarshal(c.Policy, &preset) == nil {
			args[i] = preset
		} else if err := os.WriteFile(args[i], c.Policy, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// One host a subtest, in parallel: each case starts a process, and a
	// JVM's start is most of the time.
	for name, argv := range cmds {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for i, c := range file.Cases {
				var want []string
				for _, l := range c.Lints {
					want = append(want, l.Field+": "+l.Code+": "+l.Message)
				}
				cmd := exec.Command(argv[0], append(argv[1:], "--policy", args[i])...)
				var stderr bytes.Buffer
				cmd.Stdin, cmd.Stderr = bytes.NewReader(nil), &stderr
				if out, err := cmd.Output(); err != nil || len(out) != 0 {
					t.Fatalf("case %s: %v, stdout %q\n%s", c.Name, err, out, stderr.String())
				}
				var got []string
				for _, m := range lintLine.FindAllStringSubmatch(stderr.String(), -1) {
					got = append(got, m[1]+": "+m[2]+": "+m[3])
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("case %s: warned\n  %q\nwant\n  %q\n(stderr %q)", c.Name, got, want, stderr.String())
				}
			}
		})
	}
}
