package docs_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// Issue 42: `make help` lists every target the Makefile documents with a
// "## target: what it does" comment, with that text.
func TestMakeHelpListsTheDocumentedTargets(t *testing.T) {
	mk, err := os.ReadFile(root + "/Makefile")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-s", "--no-print-directory", "help")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make help: %v", err)
	}
	targets := regexp.MustCompile(`(?m)^## ([a-z-]+): (.*)$`).FindAllStringSubmatch(string(mk), -1)
	if len(targets) < 10 {
		t.Fatalf("%d documented targets", len(targets))
	}
	for _, m := range targets {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(m[1]) + ` +` + regexp.QuoteMeta(m[2]) + `$`).Match(out) {
			t.Errorf("make help does not list %s: %s", m[1], m[2])
		}
	}
	if strings.Contains(string(out), "##") {
		t.Errorf("make help prints the comment marks:\n%s", out)
	}
}
