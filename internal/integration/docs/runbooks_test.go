package docs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The log lines docs/runbooks.md tells an operator to look for are the ones
// the code writes: each quote must be in its alert's section and, as
// written, in the source that logs it. A runbook that quotes a new log line
// adds it here.
func TestRunbookLogLinesAreWritten(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		alert, quote, source, literal string
	}{
		{"BackstopDelayedQueueStalled", "`queue promote failed`", "queue/redisqueue/worker.go", `"queue promote failed"`},
		{"BackstopDelayedQueueStalled", "`queue Q: <the Redis error>`", "sdk/python/src/backstop/redis/_core.py", `log.warning("queue %s: %s", self.name, e)`},
		{"BackstopCrashLoopNotDeadLettered", "`queue crash\nloop not dead-lettered; it stays pending`", "queue/redisqueue/worker.go", `"queue crash loop not dead-lettered; it stays pending", "queue", q.name, "entry", s.EntryID, "err"`},
		{"BackstopCrashLoopNotDeadLettered", "`queue Q: crash loop ID stays pending: not\ndead-lettered: …`", "sdk/node/lib/redis/worker.js", "`queue ${this.name}: crash loop ${entryId} stays pending: ${reason}`"},
		{"BackstopCrashLoopNotDeadLettered", "`queue Q: crash loop ID stays pending: not\ndead-lettered: …`", "contract/scripts/reclaim.lua", `'not dead-lettered: ' ..`},
		{"BackstopCrashLoopNotDeadLettered", "Python logs the same text", "sdk/python/src/backstop/redis/_core.py", `log.error("queue %s: crash loop %s stays pending: %s", queue, entry_id, why)`},
		{"BackstopSourceDown", "`scrape failed` (error) with `kind=connection`", "exporter/health.go", `log.Error("scrape failed", "kind", kind, "err", err)`},
		{"BackstopSourceDown", "`kind=connection`", "exporter/exporter.go", `kindConnection = "connection"`},
		{"BackstopSourceDown", "`kind=auth`", "exporter/exporter.go", `kindAuth       = "auth"`},
	} {
		if sec := section(string(doc), c.alert); !strings.Contains(sec, c.quote) {
			t.Errorf("docs/runbooks.md, ## %s: does not quote %q", c.alert, c.quote)
		}
		src, err := os.ReadFile(filepath.Join(root, c.source))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), c.literal) {
			t.Errorf("docs/runbooks.md, ## %s quotes %q, but %s no longer has %s: quote what the code logs", c.alert, c.quote, c.source, c.literal)
		}
	}
}

// section returns the text of a "## name" section.
func section(doc, name string) string {
	_, rest, ok := strings.Cut(doc, "\n## "+name+"\n")
	if !ok {
		return ""
	}
	sec, _, _ := strings.Cut(rest, "\n## ")
	return sec
}
