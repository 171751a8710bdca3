package dist

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 13: the repository states its license (LICENSE at its root), and
// both hosts' packages declare the same one, as their registries show it.
func TestPackagesDeclareTheRepositoryLicense(t *testing.T) {
	const spdx = "Apache-2.0"
	if text := string(readFile(t, filepath.Join(root, "LICENSE"))); !strings.Contains(text, "Apache License") || !strings.Contains(text, "Version 2.0, January 2004") {
		t.Fatalf("LICENSE is not the Apache License 2.0:\n%.200s", text)
	}
	var pkg struct{ License string }
	if err := json.Unmarshal(readFile(t, filepath.Join(root, "sdk/node/package.json")), &pkg); err != nil {
		t.Fatal(err)
	}
	if pkg.License != spdx {
		t.Errorf("sdk/node/package.json: license %q, want %q", pkg.License, spdx)
	}
	python := filepath.Join(root, ".venv/bin/python")
	out, err := exec.Command(python, "-c", `import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(p["license"]["text"], [c for c in p["classifiers"] if c.startswith("License ::")])`,
		filepath.Join(root, "sdk/python/pyproject.toml")).CombinedOutput()
	if err != nil {
		t.Fatalf("sdk/python/pyproject.toml: %v\n%s", err, out)
	}
	if want := spdx + " ['License :: OSI Approved :: Apache Software License']\n"; string(out) != want {
		t.Errorf("sdk/python/pyproject.toml: license %q, want %q", out, want)
	}
}
