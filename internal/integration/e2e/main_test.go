package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// TestMain removes the binaries build made.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	binMu    sync.Mutex
	binDir   string               // where build puts binaries, made on first use
	binBuilt = map[string]error{} // by command name
)

// build returns the path of cmd/<name> built from this tree, building it
// once per test run (a link takes seconds; tests start the exporter often).
func build(t *testing.T, name string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if binDir == "" {
		d, err := os.MkdirTemp("", "backstop-e2e-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = d
	}
	bin := filepath.Join(binDir, name)
	err, done := binBuilt[name]
	if !done {
		var out []byte
		if out, err = exec.Command("go", "build", "-o", bin, root+"/cmd/"+name).CombinedOutput(); err != nil {
			err = &buildError{name: name, err: err, out: string(out)}
		}
		binBuilt[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

type buildError struct {
	name, out string
	err       error
}

func (e *buildError) Error() string { return "build " + e.name + ": " + e.err.Error() + "\n" + e.out }
