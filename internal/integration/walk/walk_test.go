// Package walk_test is the first ten minutes of a new user, scripted (issue
// 42): the README's quick start in a real terminal, tmux at 80×24 and at
// 120×40, its commands in order, then the wrong inputs a user types, each
// checked on the screen as the user sees it.
package walk_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

const root = "../../.."

// screen is a shell in a tmux window of its own (a private tmux server).
type screen struct {
	t      *testing.T
	socket string
	n      int // commands run: each one's end is marked with its number
}

func tmuxPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatal("tmux not found: run `make deps`, which installs the Debian package tmux")
	}
	return p
}

// newScreen starts bash in a cols×rows window with path first on its PATH.
func newScreen(t *testing.T, cols, rows int, path, dir string) *screen {
	t.Helper()
	s := &screen{t: t, socket: fmt.Sprintf("backstop-walk-%d-%d", os.Getpid(), cols)}
	s.tmux("-f", "/dev/null", "new-session", "-d", "-s", "walk", "-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows), "-c", dir,
		"env", "PATH="+path+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+dir, "TERM=xterm-256color",
		"PS1=$ ", "HISTFILE=/dev/null", "bash", "--norc", "--noprofile")
	t.Cleanup(func() { exec.Command(tmuxPath(t), "-L", s.socket, "kill-server").Run() })
	s.tmux("set-option", "-g", "window-size", "manual")
	return s
}

func (s *screen) tmux(args ...string) string {
	s.t.Helper()
	out, err := exec.Command(tmuxPath(s.t), append([]string{"-L", s.socket}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// pane is what the window shows now, its trailing blank lines dropped.
func (s *screen) pane() string {
	s.t.Helper()
	return strings.TrimRight(s.tmux("capture-pane", "-p", "-t", "walk"), "\n")
}

// run clears the window and its history, types cmd and waits for the line
// that marks its end, "[N rc=STATUS]"; it returns the command's whole
// output (history included: a long usage scrolls at 24 rows).
func (s *screen) run(cmd string, timeout time.Duration) string {
	s.t.Helper()
	s.n++
	s.tmux("send-keys", "-t", "walk", "clear", "Enter")
	s.tmux("clear-history", "-t", "walk")
	s.tmux("send-keys", "-t", "walk", fmt.Sprintf("%s; echo \"[%d rc=$?]\"", cmd, s.n), "Enter")
	done := regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d rc=\d+\]`, s.n))
	var out string
	eventually.True(s.t, timeout, "the end of `"+cmd+"`", func() bool {
		out = strings.TrimRight(s.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "walk"), "\n")
		return done.MatchString(out)
	})
	return out
}

// waitFor waits until the window shows re and returns what it shows.
func (s *screen) waitFor(re string, timeout time.Duration) string {
	s.t.Helper()
	var out string
	eventually.True(s.t, timeout, "the screen to show "+re, func() bool {
		out = s.pane()
		return regexp.MustCompile(re).MatchString(out)
	})
	return out
}

// elapsed is the seconds the live view on the screen says it has run.
func elapsed(screen string) int {
	m := regexp.MustCompile(`elapsed (\d+)s`).FindStringSubmatch(screen)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// frameAfter waits for a frame of the live view drawn at least two
// seconds after one that said it had run after seconds: a frame of a
// tick after a resize, not the last one before it.
func (s *screen) frameAfter(after int) string {
	s.t.Helper()
	var out string
	eventually.True(s.t, 60*time.Second, fmt.Sprintf("a frame after %ds", after+1), func() bool {
		out = s.pane()
		return elapsed(out) >= after+2
	})
	return out
}

func (s *screen) resize(cols, rows int) {
	s.t.Helper()
	s.tmux("resize-window", "-t", "walk", "-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows))
}

func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("%s: the screen lacks %q:\n%s", what, w, out)
		}
	}
}

func TestFirstTenMinutes(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs in make test, not with -short")
	}
	tmuxPath(t)
	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	// The README's way onto the PATH: go install ./cmd/backstop.
	install := exec.Command("go", "install", "./cmd/backstop")
	install.Dir = root
	install.Env = append(os.Environ(), "GOBIN="+bin)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install ./cmd/backstop: %v\n%s", err, out)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range [][2]int{{80, 24}, {120, 40}} {
		t.Run(fmt.Sprintf("%dx%d", size[0], size[1]), func(t *testing.T) {
			walk(t, newScreen(t, size[0], size[1], bin, work), size[0], string(readme), work)
		})
	}
}

func walk(t *testing.T, s *screen, cols int, readme, work string) {
	// The quick start's command, as the README shows it.
	out := s.run("backstop policy check critical", 60*time.Second)
	mustContain(t, "policy check", out, "preset critical: valid", "attempt 3 is the last", " rc=0]")
	if !strings.Contains(readme, "$ backstop policy check critical\npreset critical: valid") {
		t.Error("the README's quick start no longer shows `backstop policy check critical`")
	}
	abs, _ := filepath.Abs(root)
	out = s.run("make -s --no-print-directory -C "+abs+" help", 30*time.Second)
	mustContain(t, "make help", out, "  demo ", "  test ", "  build ", " rc=0]")
	out = s.run("backstop version", 10*time.Second)
	if regexp.MustCompile(`backstop \n|backstop $`).MatchString(out) {
		t.Errorf("version is empty:\n%s", out)
	}

	// Wrong inputs: the problem named, the command's own usage, never the
	// 40-line global help; exit status 2.
	for _, c := range []struct {
		cmd   string
		wants []string
	}{
		{"backstop frobnicate", []string{`unknown command "frobnicate"`, `Run "backstop help"`}},
		{"backstop policy chek", []string{`(did you mean "policy check"?)`, "usage: backstop policy check"}},
		{"backstop queue stats", []string{"backstop: --queue is required", "usage: backstop queue stats --queue Q"}},
		{"backstop policy plot critical", []string{"backstop: --out is required"}},
		{"backstop demo --duraton 5s", []string{"unknown flag --duraton (did you mean --duration?)", "usage: backstop demo"}},
		{"backstop demo --duration 5", []string{"--duration 5: missing unit, e.g. 5s"}},
	} {
		out := s.run(c.cmd, 30*time.Second)
		mustContain(t, c.cmd, out, append(c.wants, fmt.Sprintf("[%d rc=2]", s.n))...)
		if strings.Contains(out, "commands:") {
			t.Errorf("%s prints the global help:\n%s", c.cmd, out)
		}
	}
	// Unit hint, generate into a directory that does not exist, queue
	// stats in words, decide answering.
	out = s.run(`echo '{"attempt":1,"http_status":503}' | backstop decide --policy critical`, 60*time.Second)
	mustContain(t, "decide", out, `"action":"retry"`, " rc=0]")
	out = s.run("backstop rules generate --out new/rules && backstop dashboards generate --out new/dashboards", 30*time.Second)
	mustContain(t, "generate", out, "wrote new/rules/backstop.alerts.yml", "wrote new/dashboards/backstop-queue.json", " rc=0]")

	// The demo: it fits the window, is redrawn in place (one header on the
	// screen, however many frames), has a deferred column, and resizes.
	s.tmux("send-keys", "-t", "walk", "clear", "Enter")
	s.tmux("clear-history", "-t", "walk")
	url := "redis://" + redistest.Start(t).Addr + "/0"
	s.tmux("send-keys", "-t", "walk", "backstop demo --listen 127.0.0.1:0 --duration 30s --redis.url "+url, "Enter")
	out = s.waitFor(`elapsed [3-9]s`, 90*time.Second)
	checkFrame(t, out, cols)
	mustContain(t, "demo", out, "deferred", "retrying", "queued", "demo-payments", "127.0.0.1:",
		"the demo deletes and rewrites its keys there: {demo-payments}")
	wide := cols + 40
	s.resize(wide, 40)
	out = s.frameAfter(elapsed(out))
	checkFrame(t, out, wide)
	mustContain(t, "demo, wider", out, "policy", "dead letters by reason")
	s.resize(cols, 24)
	out = s.frameAfter(elapsed(out))
	checkFrame(t, out, cols)
	out = s.waitFor(`summary: \d+ produced`, 90*time.Second)
	mustContain(t, "demo summary", out, "succeeded", "dead-lettered")
	if strings.Contains(out, "still in flight") {
		t.Errorf("the summary counts delayed jobs as in flight:\n%s", out)
	}
	// The demo's queue, from the command it suggests: its counters in words.
	out = s.run("backstop queue stats --redis.url "+url+" --queue demo-reports", 30*time.Second)
	mustContain(t, "queue stats", out, "queue demo-reports:", "attempts ", "success ", "dead letters by reason", "jobs that succeeded", " rc=0]")
	if strings.Contains(out, "finished_sum") || strings.Contains(out, "attempts:success") {
		t.Errorf("queue stats prints raw hash fields:\n%s", out)
	}
}

// checkFrame checks a screen of the live view: one header and one status
// line (frames redrawn in place, not piled up), and no line of the view
// wider than the window (tmux shows a wrapped line as two, so a cut line
// is one that ends within it).
func checkFrame(t *testing.T, out string, cols int) {
	t.Helper()
	if n := len(regexp.MustCompile(`(?m)^queue +(policy +)?produced`).FindAllString(out, -1)); n != 1 {
		t.Errorf("%d columns: %d headers on the screen, want 1:\n%s", cols, n, out)
	}
	if n := strings.Count(out, "payments downstream:"); n != 1 {
		t.Errorf("%d columns: %d status lines on the screen, want 1:\n%s", cols, n, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "demo-") && len([]rune(l)) >= cols {
			t.Errorf("%d columns: a line of the view fills the window (it wraps): %q", cols, l)
		}
	}
}
