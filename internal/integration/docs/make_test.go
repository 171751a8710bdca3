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

// checkMaven checks a <!-- snippet: maven --> block: the dependency it shows
// is the JVM package sdk/java/pom.xml builds.
func checkMaven(t *testing.T, b block) {
	pom, err := os.ReadFile(root + "/sdk/java/pom.xml")
	if err != nil {
		t.Fatal(err)
	}
	first := func(s, tag string) string {
		m := regexp.MustCompile(`<` + tag + `>([^<]*)</` + tag + `>`).FindStringSubmatch(s)
		if m == nil {
			return ""
		}
		return m[1]
	}
	for _, tag := range []string{"groupId", "artifactId", "version"} {
		if got, want := first(b.body, tag), first(string(pom), tag); got == "" || got != want {
			t.Errorf("%s: %s %q, sdk/java/pom.xml says %q", b, tag, got, want)
		}
	}
}

// Issue 42: the README's first screen (40 lines) is a quick start: what
// backstop is, the prerequisites (Java and Maven included), make demo, make
// test, how to put backstop on the PATH, and a command to try.
func TestReadmeFirstScreenIsAQuickStart(t *testing.T) {
	b, err := os.ReadFile(root + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	screen := strings.Join(strings.SplitN(string(b), "\n", 41)[:40], "\n")
	for _, want := range []string{"## Quick start", "Go 1.26+", "Node.js", "Python", "JDK", "Maven", "make demo", "make test",
		"go install ./cmd/backstop", "make build", "$ backstop policy check critical"} {
		if !strings.Contains(screen, want) {
			t.Errorf("the README's first 40 lines lack %q", want)
		}
	}
}
