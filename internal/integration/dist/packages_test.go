package dist

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The hosts' packages carry copies of these, made when they are built or
// installed (sdk/node/copy-assets.js, sdk/python/setup.py); the
// repository commits only the originals.
const (
	wasmFile       = "contract/backstop.wasm"
	scriptsDir     = "contract/scripts"
	errorKindsFile = "contract/errorkinds.json"
)

// A policy that dead-letters a second attempt, and the failure that shows
// it was loaded (the default would retry it).
const (
	policyJSON = `{"max_attempts": 2}`
	wantReason = "max_attempts_reached"
)

// checkout lays out, in a temporary directory, what a fresh clone holds
// of the hosts' packages: the originals, and sdk/node and sdk/python
// without any copy of them (nor node_modules, tests or build output).
func checkout(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	copyFile(t, filepath.Join(root, "go.mod"), filepath.Join(dst, "go.mod"))
	copyFile(t, filepath.Join(root, wasmFile), filepath.Join(dst, wasmFile))
	copyFile(t, filepath.Join(root, errorKindsFile), filepath.Join(dst, errorKindsFile))
	skip := map[string]bool{
		"sdk/node/backstop.wasm": true, "sdk/node/scripts": true, "sdk/node/errorkinds.json": true, "sdk/node/node_modules": true,
		"sdk/node/test": true, "sdk/node/test-support": true,
		"sdk/python/src/backstop/backstop.wasm": true, "sdk/python/src/backstop/scripts": true,
		"sdk/python/src/backstop/errorkinds.json": true,
		"sdk/python/tests":                        true, "sdk/python/build": true,
	}
	for _, dir := range []string{scriptsDir, "sdk/node", "sdk/python"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			name := d.Name()
			if skip[rel] || name == "__pycache__" || name == ".pytest_cache" || strings.HasSuffix(name, ".egg-info") ||
				strings.HasSuffix(name, ".tgz") || strings.HasSuffix(name, ".tmp") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.IsDir() {
				copyFile(t, path, filepath.Join(dst, rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// assets is what every package must carry, by its path inside the package.
func assets(t *testing.T) map[string][]byte {
	t.Helper()
	want := map[string][]byte{
		"backstop.wasm":   readFile(t, filepath.Join(root, wasmFile)),
		"errorkinds.json": readFile(t, filepath.Join(root, errorKindsFile)),
	}
	lua, err := filepath.Glob(filepath.Join(root, scriptsDir, "*.lua"))
	if err != nil || len(lua) == 0 {
		t.Fatalf("no scripts in %s (%v)", scriptsDir, err)
	}
	sql, err := filepath.Glob(filepath.Join(root, scriptsDir, "*.sql")) // the PostgreSQL idempotency store's
	if err != nil || len(sql) == 0 {
		t.Fatalf("no SQL in %s (%v)", scriptsDir, err)
	}
	for _, f := range append(lua, sql...) {
		want["scripts/"+filepath.Base(f)] = readFile(t, f)
	}
	return want
}

// wantScript is the retry script as both hosts send it: lib.lua, a newline,
// retry.lua.
func wantScript(t *testing.T) string {
	return string(readFile(t, filepath.Join(root, scriptsDir, "lib.lua"))) + "\n" +
		string(readFile(t, filepath.Join(root, scriptsDir, "retry.lua")))
}

// TestNpmPackage packs sdk/node as `npm publish` would, from a tree with
// no copy of the module or the scripts, installs the tarball, and loads a
// policy and a queue script from the installed package; then installs the
// directory itself (`npm install ./sdk/node`) and does the same.
func TestNpmPackage(t *testing.T) {
	t.Parallel()
	lookPath(t, "node")
	npm := lookPath(t, "npm")
	src := checkout(t)
	out := t.TempDir()
	run(t, filepath.Join(src, "sdk/node"), nil, npm, "pack", "--offline", "--pack-destination", out)
	tgz, _ := filepath.Glob(filepath.Join(out, "*.tgz"))
	if len(tgz) != 1 {
		t.Fatalf("npm pack wrote %q, want one tarball", tgz)
	}
	compare(t, "npm pack", untar(t, tgz[0], "package/"), assets(t))

	for _, install := range []struct{ name, arg string }{
		{"tarball", tgz[0]},
		{"directory", filepath.Join(checkout(t), "sdk/node")},
	} {
		t.Run(install.name, func(t *testing.T) {
			app := t.TempDir()
			writeFile(t, filepath.Join(app, "package.json"), `{"name": "app", "private": true, "type": "module"}`)
			run(t, app, nil, npm, "install", "--offline", "--no-audit", "--no-fund", install.arg)
			writeFile(t, filepath.Join(app, "main.js"), `
import { loadPolicy } from 'backstop-policy';
import { scriptSource } from 'backstop-policy/queue';
const policy = await loadPolicy(process.argv[2]);
const d = policy.decide({ attempt: 2, httpStatus: 503 });
console.log(JSON.stringify({ action: d.action, reason: d.reason, script: scriptSource('retry') }));
`)
			checkLoaded(t, run(t, app, nil, "node", "main.js", policyJSON))
		})
	}
}

// TestPythonPackage builds sdk/python's sdist and wheel from a tree with
// no copy of the module or the scripts (as `pip install ./sdk/python` or
// a git URL does), and a wheel from the sdist alone, checks that each
// carries them, installs the wheel and loads a policy and a queue script
// from the installed package.
func TestPythonPackage(t *testing.T) {
	t.Parallel()
	python, err := filepath.Abs(filepath.Join(root, ".venv", "bin", "python"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s missing: run `make test`, which creates the virtualenv with the Python host", python)
	}
	pkg := filepath.Join(checkout(t), "sdk/python")
	out := t.TempDir()
	// The build backend's own hook, as `python -m build --sdist` calls it;
	// no isolated build environment, so nothing is fetched.
	run(t, pkg, nil, python, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])", out)
	sdists, _ := filepath.Glob(filepath.Join(out, "*.tar.gz"))
	if len(sdists) != 1 {
		t.Fatalf("sdist: got %q, want one", sdists)
	}
	pip := []string{"-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet"}
	run(t, pkg, nil, python, append(pip, "-w", filepath.Join(out, "checkout"), pkg)...)
	run(t, out, nil, python, append(pip, "-w", filepath.Join(out, "sdist"), sdists[0])...)
	want := assets(t)
	var wheel string
	for _, from := range []string{"checkout", "sdist"} {
		whl, _ := filepath.Glob(filepath.Join(out, from, "*.whl"))
		if len(whl) != 1 {
			t.Fatalf("wheel from %s: got %q, want one", from, whl)
		}
		compare(t, "wheel from "+from, unzip(t, whl[0], "backstop/"), want)
		wheel = whl[0]
	}

	site := t.TempDir()
	run(t, out, nil, python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target", site, wheel)
	// PYTHONPATH comes before the editable install of sdk/python in .venv.
	got := run(t, out, []string{"PYTHONPATH=" + site}, python, "-c", `
import json, sys, backstop
from backstop.redis import script_source
assert backstop.__file__.startswith(sys.argv[2]), backstop.__file__
d = backstop.load_policy(sys.argv[1]).decide(attempt=2, http_status=503)
print(json.dumps({"action": d.action, "reason": d.reason, "script": script_source("retry")}))
`, policyJSON, site)
	checkLoaded(t, got)
}

func checkLoaded(t *testing.T, out []byte) {
	t.Helper()
	var got struct{ Action, Reason, Script string }
	if err := json.Unmarshal(lastLine(out), &got); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if got.Action != "dead_letter" || got.Reason != wantReason {
		t.Errorf("policy %s, second attempt on 503: got %s %s, want dead_letter %s", policyJSON, got.Action, got.Reason, wantReason)
	}
	if got.Script != wantScript(t) {
		t.Errorf("scriptSource('retry') from the installed package is not lib.lua + retry.lua of %s", scriptsDir)
	}
}

// compare checks that a package holds every asset, byte for byte, and no
// script that is not in contract/scripts.
func compare(t *testing.T, what string, files, want map[string][]byte) {
	t.Helper()
	for name, b := range want {
		got, ok := files[name]
		switch {
		case !ok:
			t.Errorf("%s: %s missing", what, name)
		case !bytes.Equal(got, b):
			t.Errorf("%s: %s differs from the repository's", what, name)
		}
	}
	for name := range files {
		if _, ok := want[name]; !ok && strings.HasPrefix(name, "scripts/") {
			t.Errorf("%s: %s is not in %s", what, name, scriptsDir)
		}
	}
}

// untar reads a .tgz into a map by path under prefix.
func untar(t *testing.T, path, prefix string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if name, ok := strings.CutPrefix(h.Name, prefix); ok && h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[name] = b
		}
	}
}

// unzip reads a wheel into a map by path under prefix.
func unzip(t *testing.T, path, prefix string) map[string][]byte {
	t.Helper()
	z, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	files := map[string][]byte{}
	for _, f := range z.File {
		name, ok := strings.CutPrefix(f.Name, prefix)
		if !ok || f.FileInfo().IsDir() {
			continue
		}
		r, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	return files
}

func run(t *testing.T, dir string, env []string, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s%s", name, strings.Join(args, " "), dir, err, out, stderr.Bytes())
	}
	return out
}

func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: the hosts' packages need it (`make deps`)", name)
	}
	return p
}

func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, string(readFile(t, src)))
}

// TestCopiesNotCommitted keeps the hosts' copies of the module and the
// scripts out of the repository: one committed copy of each (about 4 MB of
// module per policy change, not three times that).
func TestCopiesNotCommitted(t *testing.T) {
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout")
	}
	cmd := exec.Command("git", "ls-files", "--", "sdk/node/backstop.wasm", "sdk/node/scripts", "sdk/node/errorkinds.json",
		"sdk/python/src/backstop/backstop.wasm", "sdk/python/src/backstop/scripts", "sdk/python/src/backstop/errorkinds.json")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	if len(out) > 0 {
		t.Errorf("copies made by the packages' build hooks are committed (git rm --cached them):\n%s", out)
	}
}
