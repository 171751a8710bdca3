package exporter

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/backstop-dev/backstop/rules"
)

// The rules' tail_attempts must name an le bucket of backstop_job_attempts,
// or BackstopAttemptsTailHeavy selects no series and never fires: rules
// keeps its own copy of the bounds, accepted here for every bucket the
// exporter writes and refused between them.
func TestTailAttemptsAreTheExportersBuckets(t *testing.T) {
	dir := t.TempDir()
	load := func(n int) error {
		path := filepath.Join(dir, strconv.Itoa(n)+".yaml")
		must(t, os.WriteFile(path, []byte("tail_attempts: "+strconv.Itoa(n)+"\n"), 0o644))
		_, err := rules.LoadConfig(path)
		return err
	}
	for _, b := range attemptBuckets {
		if err := load(int(b)); err != nil {
			t.Errorf("tail_attempts %v, a bucket of backstop_job_attempts: %v", b, err)
		}
	}
	for _, n := range []int{0, 7, 51} {
		if err := load(n); err == nil {
			t.Errorf("tail_attempts %d accepted: no such bucket", n)
		}
	}
}
