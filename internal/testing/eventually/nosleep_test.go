package eventually

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// sleepAllowed lists the test files that may call time.Sleep, how many
// times, and why: a sleep that is part of the simulated system, not a
// test waiting for something. Everything else waits with True or Wait.
var sleepAllowed = map[string]struct {
	n   int
	why string
}{
	"queue/redisqueue/crash_test.go": {3, "the crash test's simulated fleet: a promoter's tick, a job's work " +
		"(the window a SIGKILL lands in) and the random schedule of kills"},
	"queue/rabbitmq/reliability/pressure_test.go": {1, "the memory alarm's length: the disruption itself, long enough to outlast the old confirm timeout"},
	"internal/integration/docs/readme_test.go":    {1, "a README block run as written: the reader's own sleep before a retry"},
}

// TestNoSleepInTests fails when a _test.go file calls time.Sleep more
// often than sleepAllowed says, so sleeps cannot creep back into tests; it
// fails on a stale entry too, so the list stays exact.
func TestNoSleepInTests(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][]string{} // file → positions
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Dependencies and virtualenvs are not ours; testdata is not Go.
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		for _, line := range sleeps(t, path) {
			found[rel] = append(found[rel], rel+":"+strconv.Itoa(line))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	files := make([]string, 0, len(found))
	for f := range found {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		if allowed := sleepAllowed[f]; len(found[f]) != allowed.n {
			t.Errorf("%s calls time.Sleep %d times (allowed %d): wait for the condition with eventually.True instead:\n\t%s",
				f, len(found[f]), allowed.n, strings.Join(found[f], "\n\t"))
		}
	}
	for f, allowed := range sleepAllowed {
		if len(found[f]) == 0 {
			t.Errorf("sleepAllowed lists %s (%d sleeps), which has none now: remove the entry", f, allowed.n)
		}
	}
}

// scriptSleepAllowed is sleepAllowed for the Node and Python tests: the
// one helper per language that polls (until in test-support/eventually.js,
// wait_for and until_async in conftest.py).
var scriptSleepAllowed = map[string]int{
	"sdk/node/test-support/eventually.js": 1,
	// A handler's work that outlasts what is under test (issue 26): three
	// times min_idle (held, not reclaimed) and three heartbeat timeouts
	// (the connection lives, nothing is redelivered).
	"sdk/node/test/queue-deadline.test.js":    1,
	"sdk/node/test/rabbitmq-deadline.test.js": 1,
	// Time passing is what two of its checks are about (a due job that no
	// mover moves stays; a job re-delayed is not run), and a sampler of
	// the old TTL levels polls them while a hop goes on.
	"sdk/node/test/rabbitmq-mover.test.js": 3,
	"sdk/python/tests/conftest.py":         2,
	// Issue 40's faults: a handler's work that keeps jobs in hand when the
	// memory alarm comes, the alarm's length itself (Node, Python), and in
	// Python a full queue left full while a move is refused.
	"sdk/node/test/rabbitmq-faults.test.js":    2,
	"sdk/python/tests/test_rabbitmq_faults.py": 2,
	// asyncio.sleep(0): a yield to the other task between two reads of the
	// attempt, to show each task keeps its own; no time is waited.
	"sdk/python/tests/test_layers.py": 1,
	// asyncio.sleep(0) in an outcome hook: a hook that is a real awaitable
	// (the worker must await it); no time is waited.
	"sdk/python/tests/test_outcome_hook.py": 1,
	// A handler's work (sync and async) that outlasts min idle or the
	// heartbeat timeout: how long it runs is what the deadline tests are about.
	"sdk/python/tests/test_queue_deadline.py":    2,
	"sdk/python/tests/test_rabbitmq_deadline.py": 2,
}

// scriptSleep matches a sleep in the Node tests (a promise around
// setTimeout, or node:timers/promises) and the Python tests.
var scriptSleep = regexp.MustCompile(`setTimeout\(\s*(resolve|r)\s*,|['"]node:timers/promises['"]|\b(time|asyncio)\.sleep\(`)

// TestNoSleepInScriptTests is TestNoSleepInTests for the Node and Python
// tests and their support code.
func TestNoSleepInScriptTests(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][]string{}
	for _, dir := range []string{"sdk/node/test", "sdk/node/test-support", "sdk/python/tests"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".js") || strings.HasSuffix(path, ".py")) {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			for i, line := range strings.Split(string(src), "\n") {
				code := strings.TrimSpace(line)
				if strings.HasPrefix(code, "//") || strings.HasPrefix(code, "#") || strings.HasPrefix(code, "*") {
					continue // a comment that names a sleep
				}
				if scriptSleep.MatchString(code) {
					found[rel] = append(found[rel], rel+":"+strconv.Itoa(i+1))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for f, at := range found {
		if len(at) != scriptSleepAllowed[f] {
			t.Errorf("%s sleeps %d times (allowed %d): wait for the condition with until instead:\n\t%s",
				f, len(at), scriptSleepAllowed[f], strings.Join(at, "\n\t"))
		}
	}
	for f, n := range scriptSleepAllowed {
		if len(found[f]) == 0 {
			t.Errorf("scriptSleepAllowed lists %s (%d sleeps), which has none now: remove the entry", f, n)
		}
	}
}

// sleeps returns the lines of calls to time.Sleep in a Go file,
// whatever name the file imports "time" under.
func sleeps(t *testing.T, path string) []int {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	timeName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "time" {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	if timeName == "" || timeName == "_" {
		return nil
	}
	var out []int
	ast.Inspect(f, func(n ast.Node) bool {
		// A call or a reference (time.Sleep passed as a func) both count.
		sel, ok := n.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Sleep" {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == timeName {
			out = append(out, fset.Position(sel.Pos()).Line)
		}
		return true
	})
	return out
}
