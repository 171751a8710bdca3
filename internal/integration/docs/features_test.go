package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// README.md's "What is proven, and where" names the test that proves each
// feature (issues 43 and 45). Every test it names must exist, so the table
// cannot rot: `path::name` is a file and, in it, a test of that name; a
// file alone is a file of tests generated per shared case.
func TestFeatureTableNamesRealTests(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := featureRows(t, string(readme))
	if len(rows) < 10 {
		t.Fatalf("%d rows in the feature table, want the table of issue 43 (at least 10)", len(rows))
	}
	for _, r := range rows {
		if len(r.tests) == 0 {
			t.Errorf("README.md:%d: %q names no test", r.line, r.feature)
		}
		for _, ref := range r.tests {
			if err := testExists(ref); err != "" {
				t.Errorf("README.md:%d: `%s`: %s", r.line, ref, err)
			}
		}
	}
}

// The checker itself: a test that is gone, or a name only in a comment or
// another test's name, is caught.
func TestFeatureTableCheckerCatchesMissingTests(t *testing.T) {
	for _, ref := range []string{
		"policy/lint_test.go::TestNoSuchTest",
		"policy/no_such_test.go::TestVectors",
		"policy/lint_test.go::TestLints", // a prefix of TestLintsStaySilent
		"sdk/python/tests/test_retry.py::test_reraise",
		"sdk/node/test/retry.test.js::reraise",
		"sdk/java/src/test/java/dev/backstop/RetryTest.java::retryAfter",
	} {
		if testExists(ref) == "" {
			t.Errorf("`%s` passed for a test that does not exist", ref)
		}
	}
	for _, ref := range []string{
		"policy/lint_test.go::TestLintsStaySilent",
		"sdk/python/tests/test_retry.py::test_reraise_async",
		"sdk/node/test/retry.test.js::reraise: the give-up throws the last error itself",
		"sdk/java/src/test/java/dev/backstop/RetryTest.java::retryAfterIsHonoured",
		"sdk/node/test/vectors.test.js",
	} {
		if err := testExists(ref); err != "" {
			t.Errorf("`%s`: %s", ref, err)
		}
	}
}

type featureRow struct {
	line    int
	feature string
	tests   []string
}

var testRefRE = regexp.MustCompile("`([^`]+)`")

// featureRows reads the table of the section "What is proven, and where".
func featureRows(t *testing.T, readme string) []featureRow {
	t.Helper()
	var rows []featureRow
	in := false
	for i, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "## ") {
			in = l == "## What is proven, and where"
			continue
		}
		if !in || !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| feature |") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "| "), " | ")
		if len(cells) != 2 {
			t.Errorf("README.md:%d: want | feature | test |, got %q", i+1, l)
			continue
		}
		r := featureRow{line: i + 1, feature: cells[0]}
		// Tests are the code spans naming a file of tests; the rest of the
		// cell (the lead's notes in italics) is prose.
		for _, m := range testRefRE.FindAllStringSubmatch(cells[1], -1) {
			if path, _, _ := strings.Cut(m[1], "::"); strings.Contains(path, "/") {
				r.tests = append(r.tests, m[1])
			}
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal(`README.md has no table under "## What is proven, and where"`)
	}
	return rows
}

// testExists says why ref is not a test ("" when it is): the file must
// exist and define a test of that name as its language does.
func testExists(ref string) string {
	path, name, named := strings.Cut(ref, "::")
	src, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return "no such file"
	}
	if !named {
		return ""
	}
	q := regexp.QuoteMeta(name)
	var def string
	switch {
	case strings.HasSuffix(path, ".go"):
		def = `(?m)^func ` + q + `\(t \*testing\.T\)`
	case strings.HasSuffix(path, ".py"):
		def = `(?m)^(async )?def ` + q + `\(`
	case strings.HasSuffix(path, ".java"):
		def = `(?m)^\s+(\S+ )*\S+ ` + q + `\(`
	case strings.HasSuffix(path, ".js"):
		def = `(?m)\btest\(\s*(['"` + "`" + `])` + q + `(['"` + "`" + `])\s*,`
	default:
		return "unknown kind of test file"
	}
	if !regexp.MustCompile(def).Match(src) {
		return "no test " + name + " in " + path
	}
	return ""
}
