// Package pgtest starts a private PostgreSQL server (the Debian package
// postgresql) for a test: initdb into a fresh temporary directory, then
// postgres on a free loopback port with its socket in that directory. It
// never touches the system service or its data. A missing postgres binary
// fails the test loudly: `make deps` installs it.
//
// PostgreSQL refuses to run as root; as root (CI, these machines) the
// server runs as the Debian package's system user "postgres", which owns the
// temporary directory.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Superuser is the server's superuser role; Password its password.
const (
	Superuser = "backstop"
	Password  = "pgtest-s3cret-password"
)

// Server is a postgres process owned by a test.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// Dir holds the data directory (Dir/data), the socket and the log.
	Dir  string
	cmd  *exec.Cmd
	cred *syscall.Credential
}

// Bin returns the directory of the newest PostgreSQL installed by the
// Debian packages (/usr/lib/postgresql/<major>/bin), failing t without one.
func Bin(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) < major(dirs[j]) })
	if len(dirs) == 0 {
		t.Fatal("postgres not found in /usr/lib/postgresql/*/bin: run `make deps`, which installs the Debian package postgresql")
	}
	return filepath.Dir(dirs[len(dirs)-1])
}

func major(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

// Start initialises a data directory and starts postgres on a free port,
// stopped (and its directory removed) when the test ends. Clients connect
// over TCP with Superuser and Password (scram-sha-256).
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := launch(Bin(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

var shared struct {
	sync.Mutex
	s   *Server
	err error
	dbs int
}

// Main runs a package's tests (call it from TestMain) and then stops the
// server Database started, if any.
func Main(m *testing.M) int {
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.s != nil {
		shared.s.Stop()
	}
	return code
}

// Database returns the URL of a fresh database (its own tables) on a
// server the package's tests share, started on first use: a server takes
// seconds to start, a database milliseconds. The package's TestMain must
// call Main, which stops the server.
func Database(t testing.TB) string {
	t.Helper()
	bin := Bin(t)
	shared.Lock()
	if shared.s == nil && shared.err == nil {
		shared.s, shared.err = launch(bin)
	}
	s, err := shared.s, shared.err
	shared.dbs++
	name := fmt.Sprintf("test_%d", shared.dbs)
	shared.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(s.URL())
	u.Path = "/" + name
	return u.String()
}

func launch(bin string) (_ *Server, err error) {
	// Not t.TempDir: its parents are private to root, and the server may
	// run as another user.
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and there is no system user postgres (the Debian package postgresql creates it): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	pw := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pw, []byte(Password+"\n"), 0o600); err != nil {
		return nil, err
	}
	if s.cred != nil {
		os.Chown(pw, int(s.cred.Uid), int(s.cred.Gid))
	}
	if out, err := s.command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", Superuser,
		"--pwfile", pw, "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	os.Remove(pw)
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s.Addr = "127.0.0.1:" + strconv.Itoa(port)
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	s.cmd = s.command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"), "-k", dir, "-h", "127.0.0.1",
		"-p", strconv.Itoa(port), "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), s.URL())
		if err == nil {
			conn.Close(context.Background())
			return s, nil
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			return nil, fmt.Errorf("postgres on %s did not answer: %v\n%s", s.Addr, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.Dir
	cmd.Env = []string{"LC_ALL=C", "PATH=/usr/bin:/bin"}
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// URL is a connection URL for database postgres with the superuser's
// password: a secret, as a production DSN is.
func (s *Server) URL() string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(Superuser, Password), Host: s.Addr, Path: "/postgres",
		RawQuery: "sslmode=disable"}
	return u.String()
}

// Stop ends the server with a fast shutdown and removes its directory
// (idempotent).
func (s *Server) Stop() {
	defer os.RemoveAll(s.Dir)
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// String describes the server for test logs (no password).
func (s *Server) String() string { return fmt.Sprintf("postgres on %s", s.Addr) }
