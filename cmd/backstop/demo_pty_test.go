//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// hang guards the waits below: a demo that does not get there hangs.
const hang = 60 * time.Second

// Issue 13: run the built demo as a user does, in a terminal (a pseudo-
// terminal here), let it run past where the finite demo ends, and press
// Ctrl-C: the terminal sends SIGINT to its foreground process group. The
// demo exits 0 with a true summary; the redis-server it started (in a
// session of its own, out of the terminal's reach) is gone with its files.
func TestDemoCtrlCInATerminal(t *testing.T) {
	bin := buildBackstop(t)

	t.Run("its own redis-server", func(t *testing.T) {
		tmp := t.TempDir()
		d := startInTerminal(t, bin, []string{"TMPDIR=" + tmp}, "demo", "--listen", "127.0.0.1:0")
		addr := d.waitFor(t, `Redis: redis-server (127\.0\.0\.1:\d+) \(started for the demo\)`)[1]
		for _, want := range []string{"queue stats --redis.url redis://" + addr + "/0 --queue demo-payments",
			"dlq inspect --redis.url redis://" + addr + "/0 --queue demo-payments"} {
			d.waitFor(t, regexp.QuoteMeta(want))
		}
		produced := d.runsOn(t)
		d.ctrlC(t)

		sum, _ := d.summary(t)
		if sum[0] < produced || sum[1] == 0 || sum[0] != sum[1]+sum[2]+sum[3] {
			t.Errorf("summary %v: want produced >= %d (the last frame), some succeeded, produced = succeeded + dead + in flight", sum, produced)
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Errorf("the demo's redis-server still listens on %s", addr)
		}
		left, _ := filepath.Glob(filepath.Join(tmp, "backstop-demo-redis*"))
		if len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	})

	t.Run("the summary is the queues' state", func(t *testing.T) {
		srv := redistest.Start(t)
		url := "redis://" + srv.Addr + "/0"
		d := startInTerminal(t, bin, nil, "demo", "--listen", "127.0.0.1:0", "--redis.url", url)
		d.runsOn(t)
		d.ctrlC(t)
		sum, where := d.summary(t)

		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		defer rdb.Close()
		var enq, ok, dead, queued, delayed int64
		for _, dq := range demoQueues {
			s, err := redisqueue.New(rdb, "demo-"+dq.name).Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			enq += s.Counters["enqueued"]
			ok += s.Counters["attempts:success"]
			dead += s.Counters["attempts:dead_letter"]
			queued += s.Jobs
			delayed += s.Delayed
		}
		if want := [4]int64{enq, ok, dead, enq - ok - dead}; sum != want {
			t.Errorf("summary (produced, succeeded, dead-lettered, not finished) %v; Redis says %v", sum, want)
		}
		// Issue 42: the jobs not finished are where the summary says: in
		// the jobs stream, or in the delayed set (for a retry, or deferred
		// by the breaker), not all "in flight".
		if where[0] != queued || where[1]+where[2] != delayed || sum[3] != queued+delayed {
			t.Errorf("not finished %d: %v (queued, retrying, deferred); Redis has %d in the streams, %d delayed", sum[3], where, queued, delayed)
		}
	})
}

// terminal is a command running in a pseudo-terminal, as the session
// leader with the terminal as its controlling one.
type terminal struct {
	cmd    *exec.Cmd
	master *os.File
	mu     sync.Mutex
	out    strings.Builder
	done   chan error
}

func startInTerminal(t *testing.T, bin string, env []string, args ...string) *terminal {
	t.Helper()
	master, slave := openPTY(t)
	d := &terminal{cmd: exec.Command(bin, args...), master: master, done: make(chan error, 1)}
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stdin, d.cmd.Stdout, d.cmd.Stderr = slave, slave, slave
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			d.mu.Lock()
			d.out.Write(buf[:n])
			d.mu.Unlock()
			if err != nil { // EIO once the demo and its children closed the terminal
				return
			}
		}
	}()
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		master.Close()
		if t.Failed() {
			t.Logf("terminal:\n%s", d.output())
		}
	})
	return d
}

func (d *terminal) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// waitFor waits for the pattern in the output and returns its last match.
func (d *terminal) waitFor(t *testing.T, pattern string) []string {
	t.Helper()
	re := regexp.MustCompile(pattern)
	var m []string
	eventually.True(t, hang, pattern, func() bool {
		all := re.FindAllStringSubmatch(d.output(), -1)
		if len(all) > 0 {
			m = all[len(all)-1]
		}
		return m != nil
	})
	return m
}

// runsOn waits until the demo has produced more jobs on demo-payments than
// a first frame showed (new jobs keep coming: the finite demo enqueues
// them all at once), and the exporter answers meanwhile. It returns the
// jobs produced in all, as of the last frame.
func (d *terminal) runsOn(t *testing.T) int64 {
	t.Helper()
	metrics := d.waitFor(t, `metrics: (http://\S+/metrics)`)[1]
	frame := regexp.MustCompile(`(?m)^(demo-\w+)\s+\w+\s+(\d+)`)
	total := func() (int64, int64) {
		var all, payments int64
		rows := frame.FindAllStringSubmatch(d.output(), -1)
		for _, r := range rows[max(0, len(rows)-len(demoQueues)):] {
			n, _ := strconv.ParseInt(r[2], 10, 64)
			all += n
			if r[1] == "demo-payments" {
				payments = n
			}
		}
		return all, payments
	}
	_, first := int64(0), int64(0)
	eventually.True(t, hang, "a first frame", func() bool { _, first = total(); return first > 0 })
	eventually.True(t, hang, "more jobs on demo-payments", func() bool { _, p := total(); return p > first })
	resp, err := http.Get(metrics)
	if err != nil {
		t.Fatalf("the exporter, while the demo runs: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the exporter, while the demo runs: %s", resp.Status)
	}
	all, _ := total()
	return all
}

// ctrlC types Ctrl-C: the terminal's line discipline sends SIGINT to the
// foreground process group. It waits for the demo to exit, and wants 0.
func (d *terminal) ctrlC(t *testing.T) {
	t.Helper()
	if _, err := d.master.Write([]byte{3}); err != nil {
		t.Fatal(err)
	}
	pressed := time.Now()
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("after Ctrl-C: %v, want exit status 0", err)
		}
		t.Logf("exited %v after Ctrl-C", time.Since(pressed)) // a measurement, not a test
	case <-time.After(hang):
		t.Fatalf("the demo did not exit within %v of Ctrl-C", hang)
	}
	// The reader has the last bytes once the terminal reports EIO.
	eventually.True(t, hang, "the summary", func() bool { return strings.Contains(d.output(), "summary:") })
}

// summary returns the summary's produced, succeeded, dead-lettered and
// not finished (0 when it has no such line), and where the not finished
// ones are: queued, waiting for a retry, deferred.
func (d *terminal) summary(t *testing.T) (sum [4]int64, where [3]int64) {
	t.Helper()
	m := d.waitFor(t, `summary: (\d+) produced, (\d+) succeeded, (\d+) dead-lettered, \d+ retries in \S+\r?\n`)
	for i := range 3 {
		sum[i], _ = strconv.ParseInt(m[i+1], 10, 64)
	}
	if m := regexp.MustCompile(`not finished: (\d+): (\d+) queued, (\d+) waiting for a retry, (\d+) deferred by the breaker`).FindStringSubmatch(d.output()); m != nil {
		sum[3], _ = strconv.ParseInt(m[1], 10, 64)
		for i := range where {
			where[i], _ = strconv.ParseInt(m[i+2], 10, 64)
		}
	}
	return sum, where
}

// openPTY opens a pseudo-terminal pair (posix_openpt, unlockpt, ptsname).
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, slave
}
