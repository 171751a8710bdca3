package host_test

import (
	"context"
	"os"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

func TestCompilationCache(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for i := 0; i < 2; i++ { // the second Runtime starts from the cache
		rt, err := host.New(ctx, host.WithCompilationCache(dir), host.WithPoolSize(1))
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		p, err := rt.Preset(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		if d, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, Random: 0.5}); err != nil || d.DelayMs != 500 {
			t.Errorf("run %d: %v, %v", i, d, err)
		}
		if err := rt.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) == 0 {
			t.Fatal("the cache directory is empty")
		}
	}
	// A path that cannot be a directory fails New, not a later call.
	file := dir + "/file"
	os.WriteFile(file, nil, 0o644)
	if _, err := host.New(ctx, host.WithCompilationCache(file)); err == nil {
		t.Error("a file as cache directory was accepted")
	}
}
