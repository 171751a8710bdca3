// Package docs_test proves that the code blocks of the documentation run as
// written (issue 13, "Docs that run").
//
// Every fenced block of the files in docFiles is checked by one suite:
//
//   - ```go: the block is a compiled-and-run test of this package (its lines,
//     spacing aside, appear in order in one of this package's _test.go
//     files);
//   - ```js: sdk/node/test/docs.test.js runs it with the package;
//   - ```python: sdk/python/tests/test_docs.py execs it;
//   - ```java: sdk/java/src/test/java/dev/backstop/ReadmeTest.java compiles
//     and runs it with the package (`make java-test`);
//   - a block whose first line starts with "$ ": each command runs through
//     sh with the built CLI on PATH and its output (stdout and stderr) must
//     be the text shown; a "..." line stands for any lines;
//   - any other block says what to do with it in an HTML comment on the line
//     before its fence: <!-- snippet: run --> (each line is a command that
//     must succeed), <!-- snippet: policy --> (a policy file policy.Parse
//     accepts), <!-- snippet: synopsis --> (a usage synopsis whose flags
//     `backstop CMD -h` lists), <!-- snippet: file=NAME --> (written as
//     NAME for the blocks after it), <!-- snippet: spring --> (a Spring Boot
//     application's ```yaml application.yml and ```java listener, which
//     sdk/java-spring's SpringReadmeTest boots together against a real
//     rabbitmq-server), <!-- snippet: skip=why --> (not run, and the reason).
//
// A block that fits none of these fails TestDocsEveryBlockIsRun, so a new
// block cannot rot unseen. Commands run in a temporary directory against a
// real redis-server; the address redis://127.0.0.1:6379/0 (and
// 127.0.0.1:6379) written in a block stands for that server.
package docs_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
)

const root = "../../.."

// docFiles are the documents whose blocks must run (the Node and Python
// suites read the same list).
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "sdk/node/README.md", "sdk/python/README.md", "queue/redisqueue/README.md", "queue/rabbitmq/README.md",
		"sdk/java/README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(m, root+"/")))
	}
	return files
}

type block struct {
	file   string
	line   int    // of the opening fence, 1-based
	lang   string // after the fence
	marker string // the snippet comment's text, "" when none
	body   string
}

func (b block) String() string { return fmt.Sprintf("%s:%d (```%s block)", b.file, b.line, b.lang) }

var markerRE = regexp.MustCompile(`^<!--\s*snippet:\s*(.*?)\s*-->$`)

// blocks returns the fenced blocks of a markdown file.
func blocks(t *testing.T, file string) []block {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	return parseBlocks(t, file, string(data))
}

func parseBlocks(t *testing.T, file, text string) []block {
	lines := strings.Split(text, "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "```") {
			continue
		}
		b := block{file: file, line: i + 1, lang: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
		if i > 0 {
			if m := markerRE.FindStringSubmatch(strings.TrimSpace(lines[i-1])); m != nil {
				b.marker = m[1]
			}
		}
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			t.Errorf("%s: not closed", b)
		}
		b.body = strings.Join(body, "\n")
		out = append(out, b)
	}
	return out
}

// javaDocFiles are the documents whose ```java blocks the Java suite runs
// (ReadmeTest.FILES in sdk/java holds the same list).
var javaDocFiles = []string{"README.md", "sdk/java/README.md", "docs/idempotency.md"}

// env is what the commands of the blocks run with.
type env struct {
	bin   string // directory of the built backstop
	redis string // host:port of a real redis-server
}

func TestDocsEveryBlockIsRun(t *testing.T) {
	for _, suite := range []string{"sdk/node/test/docs.test.js", "sdk/python/tests/test_docs.py", "sdk/java/src/test/java/dev/backstop/ReadmeTest.java"} {
		if _, err := os.Stat(filepath.Join(root, suite)); err != nil {
			t.Errorf("the ```js, ```python and ```java blocks are run by %s: %v", suite, err)
		}
	}
	e := env{bin: buildCLI(t), redis: redistest.Start(t).Addr}
	goSources := goSnippetSources(t)
	for _, file := range docFiles(t) {
		work := t.TempDir() // one per document: its file= blocks serve its commands
		if err := os.MkdirAll(filepath.Join(work, "docs", "img"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks(t, file) {
			t.Run(fmt.Sprintf("%s:%d", file, b.line), func(t *testing.T) {
				checkBlock(t, b, e, work, goSources)
			})
		}
	}
}

func checkBlock(t *testing.T, b block, e env, work string, goSources map[string]string) {
	key, val, _ := strings.Cut(b.marker, "=")
	switch {
	case b.marker == "" && b.lang == "go":
		for _, src := range goSources {
			if containsLines(src, b.body) {
				return
			}
		}
		t.Errorf("%s is not run: add it, as written, to a test in internal/integration/docs/*_test.go", b)
	case b.marker == "" && (b.lang == "js" || b.lang == "python"):
		// Run by sdk/node/test/docs.test.js or sdk/python/tests/test_docs.py.
	case b.marker == "" && b.lang == "java":
		// Run by sdk/java/src/test/java/dev/backstop/ReadmeTest.java, which
		// reads the documents of javaDocFiles.
		if !slices.Contains(javaDocFiles, b.file) {
			t.Errorf("%s is not run: ReadmeTest.FILES (sdk/java) runs the ```java blocks of %v only", b, javaDocFiles)
		}
	case b.marker == "" && strings.HasPrefix(b.body, "$ "):
		runTranscript(t, b, e, work)
	case key == "run":
		for _, cmd := range strings.Split(b.body, "\n") {
			cmd = strings.TrimSpace(cmd)
			if cmd == "" || strings.HasPrefix(cmd, "#") {
				continue
			}
			if out, err := e.sh(work, cmd); err != nil {
				t.Errorf("%s: `%s` failed: %v\n%s", b, cmd, err, out)
			}
		}
	case key == "synopsis":
		checkSynopsis(t, b, e, work)
	case key == "maven":
		checkMaven(t, b)
	case key == "spring":
		// A Spring Boot application's application.yml and listener: run
		// together by backstop-spring's SpringReadmeTest (make java-test).
		if !slices.Contains(javaDocFiles, b.file) || (b.lang != "yaml" && b.lang != "java") {
			t.Errorf("%s: SpringReadmeTest (sdk/java-spring) runs the ```yaml and ```java spring blocks of %v only", b, javaDocFiles)
		}
	case key == "policy":
		if _, err := policy.Parse([]byte(b.body)); err != nil {
			t.Errorf("%s: not a valid policy: %v", b, err)
		}
	case key == "file" && val != "":
		if err := os.WriteFile(filepath.Join(work, val), []byte(b.body+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	case key == "skip" && strings.TrimSpace(val) != "":
		t.Skipf("%s: not run: %s", b, val)
	case b.marker != "":
		t.Errorf("%s: unknown marker <!-- snippet: %s -->: want run, policy, synopsis, maven, spring, file=NAME or skip=why", b, b.marker)
	default:
		t.Errorf("%s is not run by any test: a ```go, ```js, ```python or ```java block is run by its language's suite, "+
			"a `$ backstop …` transcript is compared with the CLI's output; mark any other block with "+
			"<!-- snippet: run|policy|synopsis|file=NAME|skip=why --> on the line before its fence", b)
	}
}

var (
	synCmdRE  = regexp.MustCompile(`^backstop( [a-z][a-z-]*)*`)
	synFlagRE = regexp.MustCompile(`--([a-z][a-z0-9.-]*)`)
)

// checkSynopsis checks a usage synopsis against the CLI: every --flag of a
// "backstop CMD …" line (and of its indented continuation lines) is a flag
// that `backstop CMD -h` lists.
func checkSynopsis(t *testing.T, b block, e env, work string) {
	cmd, help := "", ""
	for _, l := range strings.Split(b.body, "\n") {
		if c := synCmdRE.FindString(l); c != "" {
			cmd = c
			help, _ = e.sh(work, cmd+" -h")
		} else if cmd == "" || !strings.HasPrefix(l, " ") {
			t.Errorf("%s: %q is not a line of a `backstop CMD …` synopsis", b, l)
			continue
		}
		for _, m := range synFlagRE.FindAllStringSubmatch(l, -1) {
			if !regexp.MustCompile(`(?m)^\s+--?` + regexp.QuoteMeta(m[1]) + `\b`).MatchString(help) {
				t.Errorf("%s: `%s -h` lists no flag --%s:\n%s", b, cmd, m[1], help)
			}
		}
	}
}

// runTranscript runs the "$ " lines of a block and compares their output
// with the lines that follow each one.
func runTranscript(t *testing.T, b block, e env, work string) {
	type step struct {
		cmd  string
		want []string
	}
	var steps []step
	for _, l := range strings.Split(b.body, "\n") {
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			steps = append(steps, step{cmd: c})
			continue
		}
		steps[len(steps)-1].want = append(steps[len(steps)-1].want, l)
	}
	for _, s := range steps {
		cmd := s.cmd
		if c, ok := strings.CutPrefix(cmd, "go run ./cmd/backstop "); ok {
			cmd = "backstop " + c // the same program, built once
		}
		out, _ := e.sh(work, cmd) // an error's exit status is not shown: its text is
		got := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if !matchLines(got, trimTrailingEmpty(s.want)) {
			t.Errorf("%s: `%s` printed\n%s\nthe document shows\n%s", b, s.cmd, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// sh runs a command line as a reader would, with the built CLI on PATH and
// the test's Redis in place of the documented address.
func (e env) sh(dir, cmd string) (string, error) {
	cmd = strings.ReplaceAll(cmd, "redis://127.0.0.1:6379/0", "redis://"+e.redis+"/0")
	cmd = strings.ReplaceAll(cmd, "127.0.0.1:6379", e.redis)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	c.Dir = dir
	c.Env = append(os.Environ(), "PATH="+e.bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"BACKSTOP_REDIS_URL=redis://"+e.redis+"/0", "NO_COLOR=1")
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return out.String(), err
}

// matchLines compares output with the document's lines, a "..." line
// standing for any number of lines.
func matchLines(got, want []string) bool {
	if len(want) == 0 {
		return len(got) == 0 || (len(got) == 1 && got[0] == "")
	}
	if strings.TrimSpace(want[0]) == "..." {
		for i := 0; i <= len(got); i++ {
			if matchLines(got[i:], want[1:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && strings.TrimRight(got[0], " ") == strings.TrimRight(want[0], " ") && matchLines(got[1:], want[1:])
}

func trimTrailingEmpty(l []string) []string {
	for len(l) > 0 && strings.TrimSpace(l[len(l)-1]) == "" {
		l = l[:len(l)-1]
	}
	return l
}

// goSnippetSources reads this package's test files, which hold the Go
// blocks.
func goSnippetSources(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(data)
	}
	return out
}

// containsLines reports whether the non-empty lines of block appear, one
// after the other and spacing aside, in src.
func containsLines(src, block string) bool {
	norm := func(s string) []string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if f := strings.Fields(l); len(f) > 0 {
				out = append(out, strings.Join(f, " ")) // gofmt aligns comments its own way
			}
		}
		return out
	}
	s, b := norm(src), norm(block)
	for i := 0; i+len(b) <= len(s); i++ {
		match := true
		for j := range b {
			if s[i+j] != b[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// buildCLI builds cmd/backstop into a temporary directory.
func buildCLI(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("BACKSTOP_DOCS_CLI"); bin != "" {
		return filepath.Dir(bin) // a backstop built elsewhere, when the tree does not build
	}
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "backstop"), "github.com/backstop-dev/backstop/cmd/backstop").CombinedOutput()
	if err != nil {
		t.Fatalf("building cmd/backstop: %v\n%s", err, out)
	}
	return dir
}

// TestDocsMarkersAreSeen guards the checker itself: a block with no marker
// and no runnable language is reported.
func TestDocsMarkersAreSeen(t *testing.T) {
	md := "text\n\n```\nsomething\n```\n\n<!-- snippet: skip=shown only -->\n```sh\nmake demo\n```\n"
	bs := parseBlocks(t, "x.md", md)
	if len(bs) != 2 || bs[0].marker != "" || bs[1].marker != "skip=shown only" || bs[1].body != "make demo" {
		t.Fatalf("blocks = %+v", bs)
	}
	if !matchLines([]string{"a", "b", "c"}, []string{"a", "...", "c"}) || matchLines([]string{"a", "b"}, []string{"a", "c"}) {
		t.Fatal("matchLines")
	}
}
