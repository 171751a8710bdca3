// Package rabbitmqserver starts real rabbitmq-server processes (the Debian
// package, 3.10): each on free loopback ports, with its own node name, HOME
// (the Erlang cookie), data and log directories, and the management plugin.
// `backstop demo --broker rabbitmq` runs one; the tests run theirs through
// internal/testing/rabbittest, which ties them to a testing.TB.
//
//	b, err := rabbitmqserver.Start() // the caller calls b.Stop
//
// A broker takes about 6 s to start.
package rabbitmqserver

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Server is the broker's start script; run directly, not through the
// /usr/sbin wrapper, which switches to the rabbitmq user and then cannot
// write our directories.
const Server = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// startTimeout bounds one start; a cold start takes ~6 s, far more on a
// busy 2-core machine running other brokers.
const startTimeout = 90 * time.Second

// Broker is a rabbitmq-server process owned by a test or a program.
type Broker struct {
	name     string // Erlang node name, name@localhost
	dir      string
	ownsDir  bool // Start made dir; Stop removes it
	amqpPort int
	mgmtPort int
	distPort int
	config   []string
	server   string // the start script: Server unless WithServer
	ports    []int  // amqp, management, distribution; free ones unless set (a cluster's)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Option configures a broker.
type Option func(*Broker)

// WithConfig adds lines to the broker's rabbit.conf (new-style sysctl
// format), e.g. "vm_memory_high_watermark.relative = 0.8".
func WithConfig(lines ...string) Option {
	return func(b *Broker) { b.config = append(b.config, lines...) }
}

// WithServer runs the rabbitmq-server start script at path instead of
// Server (a demo finds it on the PATH); rabbitmqctl is taken beside it.
func WithServer(path string) Option {
	return func(b *Broker) { b.server = path }
}

// Start starts a broker in a new temporary directory (dir "" ) or in dir,
// which the caller owns. The caller must call Stop, which also removes a
// directory Start made.
func Start(dir string, opts ...Option) (*Broker, error) {
	if dir != "" {
		b, err := newBroker(dir, false, opts)
		if err == nil {
			err = b.start()
		}
		return b, err
	}
	dir, err := os.MkdirTemp("", "rabbitmqserver-")
	if err != nil {
		return nil, fmt.Errorf("rabbitmqserver: %w", err)
	}
	b, err := newBroker(dir, true, opts)
	if err == nil {
		err = b.start()
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

func newBroker(dir string, ownsDir bool, opts []Option) (*Broker, error) {
	b := &Broker{dir: dir, ownsDir: ownsDir, server: Server}
	for _, o := range opts {
		o(b)
	}
	if _, err := os.Stat(b.server); err != nil {
		return nil, fmt.Errorf("rabbitmqserver: %s not found (%v): run `make deps`, which installs the Debian package rabbitmq-server", b.server, err)
	}
	ports := b.ports
	if ports == nil {
		var err error
		if ports, err = freePorts(3); err != nil {
			return nil, err
		}
	}
	b.amqpPort, b.mgmtPort, b.distPort = ports[0], ports[1], ports[2]
	b.name = "backstop" + strconv.Itoa(b.amqpPort) + "@localhost"
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("rabbitmqserver: %w", err)
		}
	}
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nmanagement.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %d\nloopback_users = none\n%s\n",
		b.amqpPort, b.mgmtPort, strings.Join(b.config, "\n"))
	if err := os.WriteFile(filepath.Join(dir, "rabbit.conf"), []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("rabbitmqserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[rabbitmq_management].\n"), 0o644); err != nil {
		return nil, fmt.Errorf("rabbitmqserver: %w", err)
	}
	return b, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago,
// at most 55535: the Erlang CLI tools use the distribution port + 10000.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("rabbitmqserver: free port: %w", err)
		}
		ls = append(ls, l) // held open so the next Listen picks another
		if p := l.Addr().(*net.TCPAddr).Port; p <= 55535 {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

func (b *Broker) env() []string {
	return append(os.Environ(),
		"HOME="+filepath.Join(b.dir, "home"),
		"RABBITMQ_NODENAME="+b.name,
		"RABBITMQ_MNESIA_BASE="+filepath.Join(b.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(b.dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(b.dir, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(b.dir, "rabbit"),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(b.distPort),
		"RABBITMQ_LOGS=-", // to stdout, i.e. server.log, which the error tail reads
		// The start script then execs erl (no shell in between), so
		// SIGTERM reaches the VM, which stops gracefully.
		"RUNNING_UNDER_SYSTEMD=true",
	)
}

func (b *Broker) start() error {
	logf, err := os.OpenFile(b.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("rabbitmqserver: %w", err)
	}
	cmd := exec.Command(b.server)
	cmd.Dir = b.dir
	cmd.Env = b.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("rabbitmqserver: start %s: %w", b.server, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	b.mu.Lock()
	b.cmd, b.done = cmd, done
	b.mu.Unlock()

	exited := false
	err = waitFor(startTimeout, func() bool {
		select {
		case <-done:
			exited = true
			return true
		default:
		}
		return b.ready()
	})
	if exited || err != nil {
		b.Kill()
		why := "did not answer GET /api/overview within " + startTimeout.String()
		if exited {
			why = "exited: " + cmd.ProcessState.String()
		}
		return fmt.Errorf("rabbitmqserver: rabbitmq-server %s (amqp %d, management %d) %s; log tail:\n%s",
			b.name, b.amqpPort, b.mgmtPort, why, b.LogTail(40))
	}
	return nil
}

// ready reports whether the management API answers and AMQP accepts.
func (b *Broker) ready() bool {
	req, _ := http.NewRequest(http.MethodGet, b.ManagementURL()+"/api/overview", nil)
	req.SetBasicAuth("guest", "guest")
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b.amqpPort), 2*time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func (b *Broker) logPath() string { return filepath.Join(b.dir, "server.log") }

// LogTail returns the last n lines the broker wrote.
func (b *Broker) LogTail(n int) string {
	out, err := os.ReadFile(b.logPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// URL is the AMQP URL, amqp://guest:guest@127.0.0.1:PORT/.
func (b *Broker) URL() string {
	return "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(b.amqpPort) + "/"
}

// ManagementURL is the management API's base, http://127.0.0.1:PORT (user
// and password guest).
func (b *Broker) ManagementURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(b.mgmtPort)
}

// Node is the broker's Erlang node name (for rabbitmqctl -n).
func (b *Broker) Node() string { return b.name }

// Ctl runs rabbitmqctl against the broker (same HOME, so the same cookie)
// and returns its combined output.
func (b *Broker) Ctl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(filepath.Dir(b.server), "rabbitmqctl"), append([]string{"-n", b.name}, args...)...)
	cmd.Env = b.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Stop stops the broker gracefully (SIGTERM; SIGKILL after 60 s) and
// waits for it. Idempotent. A broker in a directory Start made also loses its
// directory.
func (b *Broker) Stop() {
	b.stop(syscall.SIGTERM, 60*time.Second)
	if b.ownsDir {
		os.RemoveAll(b.dir)
	}
}

// Kill kills the broker's processes at once (a crash: unacked deliveries
// come back after Restart) and waits for them. Idempotent.
func (b *Broker) Kill() { b.stop(syscall.SIGKILL, 0) }

func (b *Broker) stop(sig syscall.Signal, grace time.Duration) {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	signal(cmd.Process, sig)
	select {
	case <-done:
	case <-time.After(grace):
	}
	killGroup(cmd.Process)
	<-done
}

// Restart stops the broker (gracefully) and starts it again with the same
// node name, data directory and ports: durable queues and persistent
// messages survive.
func (b *Broker) Restart() error {
	b.stop(syscall.SIGTERM, 60*time.Second)
	return b.startAgain()
}

// KillAndRestart kills the broker (a crash) and starts it again on the
// same data and ports.
func (b *Broker) KillAndRestart() error {
	b.Kill()
	return b.startAgain()
}

// startAgain starts the stopped broker; a port taken meanwhile by another
// process makes it fail, and the error (with the log tail) says so.
func (b *Broker) startAgain() error { return b.start() }

// Running reports whether the broker process is up.
func (b *Broker) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return false
	}
	select {
	case <-b.done:
		return false
	default:
		return true
	}
}

// waitFor polls cond every 10 ms until it holds, or fails once deadline
// has passed.
func waitFor(deadline time.Duration, cond func() bool) error {
	end := time.Now().Add(deadline)
	for !cond() {
		if !time.Now().Before(end) {
			return fmt.Errorf("timed out after %v", deadline)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
