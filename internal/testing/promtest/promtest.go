// Package promtest runs Debian's prometheus on loopback for a test: private
// storage, a scrape of the given targets every second, stopped when the
// test ends. A missing prometheus fails the test (make deps installs it).
package promtest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
)

// Start runs prometheus scraping targets (host:port, path /metrics) every
// second as job "backstop", and returns its address for the query API.
func Start(t testing.TB, targets ...string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found: make deps installs the Debian package prometheus: %v", err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: backstop\n    static_configs: [{targets: [\"%s\"]}]\n",
		strings.Join(targets, `", "`))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file=prometheus.yml", "--storage.tsdb.path=data", "--web.listen-address="+addr)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	ready := func() bool {
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if eventually.Wait(60*time.Second, ready) != nil {
		out, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
		t.Fatalf("prometheus not ready at %s:\n%s", addr, out)
	}
	return addr
}
