// Package dist checks what users of backstop get when they install it: a Go
// module whose requirements are tidy and cost a Go service nothing beyond
// the policy and the host, and the npm and Python packages, built as they
// are published, carrying backstop.wasm and the queue scripts.
package dist

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// root is the repository (and Go module) root.
const root = "../../.."

// TestModuleTidy fails when go.mod or go.sum is not what `go mod tidy`
// writes: a missing or stale requirement, a direct one marked indirect, or
// a tidy that cannot run at all (an ambiguous import).
func TestModuleTidy(t *testing.T) {
	cmd := exec.Command("go", "mod", "tidy", "-diff")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy -diff: %v (run `go mod tidy`)\n%s", err, out)
	}
}

// TestConsumerFootprint builds the go.sum of a fresh module that imports
// only policy and host, as a Go service would: the exporter's, the CLI's
// and the tests' dependencies (Prometheus, Alertmanager, gonum, miniredis)
// must never reach it.
func TestConsumerFootprint(t *testing.T) {
	mods := consumerModules(t, "host", "policy")
	want := []string{"github.com/tetratelabs/wazero", "go.yaml.in/yaml/v3", "golang.org/x/sys"}
	if !slices.Equal(mods, want) {
		t.Errorf("a module that imports only policy and host needs checksums of %q, want %q", mods, want)
	}
}

// TestRetryConsumerFootprint: a service that also runs the retry loop gets
// client_golang (retry.WithMetrics) and what it needs, never the queue's
// go-redis, the exporter's Prometheus server packages or miniredis.
func TestRetryConsumerFootprint(t *testing.T) {
	mods := consumerModules(t, "host", "policy", "retry")
	if !slices.Contains(mods, "github.com/prometheus/client_golang") {
		t.Errorf("retry imports client_golang; the consumer's go.sum lacks it: %q", mods)
	}
	for _, m := range mods {
		for _, banned := range []string{"github.com/redis/go-redis", "github.com/alicebob/miniredis", "github.com/prometheus/prometheus",
			"github.com/prometheus/alertmanager", "github.com/prometheus/exporter-toolkit", "gonum.org/"} {
			if strings.HasPrefix(m, banned) {
				t.Errorf("a module that imports policy, host and retry needs %s (go.sum: %q)", m, mods)
			}
		}
	}
}

// consumerModules returns the modules in the go.sum of a fresh module that
// imports this module's packages pkgs, after go mod tidy.
func consumerModules(t *testing.T, pkgs ...string) []string {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	var mod struct {
		Module struct{ Path string }
		Go     string
	}
	edit := exec.Command("go", "mod", "edit", "-json")
	edit.Dir = root
	out, err := edit.Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "go.mod"), "module example.com/consumer\n\ngo "+mod.Go+"\n\n"+
		"require "+mod.Module.Path+" v0.0.0\n\nreplace "+mod.Module.Path+" => "+abs+"\n")
	imports := ""
	for _, p := range pkgs {
		imports += "\t_ \"" + mod.Module.Path + "/" + p + "\"\n"
	}
	write(t, filepath.Join(dir, "main.go"), "package main\n\nimport (\n"+imports+")\n\nfunc main() {}\n")
	// Seeded with this module's go.sum (which tidy then prunes) so that no
	// checksum database is asked: the test runs offline once `make deps`
	// has filled the module cache.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(sum))

	tidy := exec.Command("go", "mod", "tidy")
	tidy.Dir = dir
	tidy.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := tidy.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy in a module that imports %v: %v\n%s", pkgs, err, out)
	}
	got, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	var mods []string
	sc := bufio.NewScanner(bytes.NewReader(got))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && !slices.Contains(mods, f[0]) {
			mods = append(mods, f[0])
		}
	}
	return mods
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCommandsBuildOnEveryOS compiles the commands for macOS and Windows:
// backstop and backstop-exporter are installed with `go install` there too,
// and Linux-only process control (Pdeathsig, process groups, signals) once
// kept `backstop` from building on Windows. (Several main packages: go
// build compiles them and discards the result, no linking.)
func TestCommandsBuildOnEveryOS(t *testing.T) {
	for _, goos := range []string{"darwin", "windows"} {
		t.Run(goos, func(t *testing.T) {
			run(t, root, []string{"GOOS=" + goos, "GOARCH=amd64", "CGO_ENABLED=0"}, "go", "build", "./cmd/...")
		})
	}
}
