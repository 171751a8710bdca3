package policy_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// docs/policy.md states the limits the code enforces.
func TestDocsStateTheLimits(t *testing.T) {
	b, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{
		fmt.Sprintf("| %d bytes (%d KiB)", policy.MaxFileBytes, policy.MaxFileBytes>>10),
		fmt.Sprintf("must be at most %d bytes", policy.MaxFileBytes),
		fmt.Sprintf("| %d entries |", policy.MaxTableEntries),
		fmt.Sprintf("| %d items |", policy.MaxListItems),
		fmt.Sprintf("| the first %d, then a count |", policy.MaxProblems),
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/policy.md does not say %q", want)
		}
	}
}
