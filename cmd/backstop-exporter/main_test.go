package main

import (
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/version"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/internal/testing/webconfig"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("BACKSTOP_QUEUES", "orders,emails")
	t.Setenv("BACKSTOP_REDIS_MODE", "cluster")
	t.Setenv("BACKSTOP_SCRAPE_TIMEOUT", "2s")
	t.Setenv("BACKSTOP_WEB_LISTEN_ADDRESS", "127.0.0.1:9999")
	t.Setenv("BACKSTOP_LOG_LEVEL", "debug")
	f, err := parse([]string{"--scrape.timeout=3s"}, io.Discard) // a flag beats its variable
	if err != nil {
		t.Fatal(err)
	}
	if f.queues != "orders,emails" || f.redis.mode != "cluster" || f.timeout != 3*time.Second ||
		(*f.web.WebListenAddresses)[0] != "127.0.0.1:9999" || f.log.Level.String() != "debug" {
		t.Errorf("parsed %+v, web %v, level %v", f, *f.web.WebListenAddresses, f.log.Level)
	}
}

func TestFlagDefaults(t *testing.T) {
	f, err := parse([]string{"--queues=a"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if (*f.web.WebListenAddresses)[0] != ":9797" || f.metricsPath != "/metrics" || f.timeout != 5*time.Second ||
		f.redis.addr != "localhost:6379" || f.redis.mode != "standalone" || f.refresh != time.Minute || f.maxKeys != 10000 {
		t.Errorf("defaults: %+v", f)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no queues"},
		{[]string{"--queues=a", "--redis.mode=ring"}, "enum value must be one of"},
		{[]string{"--queues=a", "--scrape.timeout=soon"}, "time: invalid duration"},
		{[]string{"--queues=a", "--alertmanager.config.file=am.yml"}, "give --alertmanager.url too"},
	} {
		if _, err := parse(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse(%q): %v, want %q", tc.args, err, tc.want)
		}
	}
	for _, r := range []redisFlags{
		{mode: "sentinel", addr: "a:1"},
		{mode: "standalone", addr: "a:1,b:2"},
		{mode: "standalone", addr: "a:1", url: "http://x"},
		{mode: "standalone", addr: "a:1", passwordFile: "/nonexistent"},
	} {
		if _, err := r.client(); err == nil {
			t.Errorf("%+v: no error", r)
		}
	}
	f, _ := parse([]string{"--queues.config=/nonexistent.yaml"}, io.Discard)
	if _, err := f.collector(redis.NewClient(&redis.Options{}), nil); err == nil || !strings.Contains(err.Error(), "nonexistent.yaml") {
		t.Errorf("missing config: %v", err)
	}
}

// TestClients reaches a password-protected server by --redis.password-file
// and by URL, and a cluster; the sentinel mode asks sentinels for the
// master (a plain server refuses).
func TestClients(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	if err := srv.Client().ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster := redistest.StartCluster(t, 3)
	for name, r := range map[string]redisFlags{
		"password file": {mode: "standalone", addr: srv.Addr, passwordFile: pw},
		"url":           {mode: "standalone", addr: "ignored:1", url: "redis://:s3cret@" + srv.Addr + "/0"},
		"cluster":       {mode: "cluster", addr: strings.Join(cluster.Addrs, ",")},
		"cluster url":   {mode: "cluster", url: "redis://" + cluster.Addrs[0] + "?addr=" + cluster.Addrs[1]},
	} {
		rdb, err := r.client()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Errorf("%s: ping: %v", name, err)
		}
		rdb.Close()
	}
	rdb, err := redisFlags{mode: "sentinel", addr: srv.Addr, sentinelMaster: "m", passwordFile: pw}.client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "sentinel") {
		t.Errorf("sentinel mode against a plain server: %v", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestServe runs the exporter as main does, behind basic auth from
// --web.config.file, and reads its pages.
func TestServe(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	q := redisqueue.New(srv.Client(), "orders")
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, "job-1", nil); err != nil {
		t.Fatal(err)
	}
	webConfig := webconfig.BasicAuth(t, "prom", "pass")
	addr := freeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"--redis.addr=" + srv.Addr, "--queues=orders", "--web.listen-address=" + addr,
			"--web.config.file=" + webConfig, "--log.level=warn"}, io.Discard)
	}()

	get := func(path string, auth bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if auth {
			req.SetBasicAuth("prom", "pass")
		}
		var resp *http.Response
		eventually.True(t, 10*time.Second, "GET "+path+" (the server is starting)", func() bool {
			var err error
			resp, err = http.DefaultClient.Do(req)
			return err == nil
		})
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/metrics", false); code != http.StatusUnauthorized {
		t.Errorf("metrics without auth: %d", code)
	}
	code, body := get("/metrics", true)
	for _, want := range []string{"backstop_up 1", `backstop_enqueued_total{queue="orders"} 1`,
		"backstop_exporter_build_info{", "go_goroutines ", "process_resident_memory_bytes "} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("metrics: %d, missing %q", code, want)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.SetBasicAuth("prom", "pass")
	req.Header.Set("Accept-Encoding", "gzip")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil || resp.Header.Get("Content-Encoding") != "gzip" {
			t.Errorf("gzip scrape: %v, Content-Encoding %q", err, resp.Header.Get("Content-Encoding"))
		} else if b, _ := io.ReadAll(zr); !strings.Contains(string(b), "backstop_up 1") {
			t.Error("gzip scrape lacks backstop_up 1")
		}
		resp.Body.Close()
	}
	// Prometheus asks for OpenMetrics first, and gets it, gzipped, from
	// twelve concurrent scrapes.
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
			req.SetBasicAuth("prom", "pass")
			req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
			resp, err := http.DefaultClient.Do(req) // gzip asked and undone by the transport
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/openmetrics-text; version=1.0.0") ||
				!strings.HasSuffix(string(b), "# EOF\n") || !strings.Contains(string(b), "process_resident_memory_bytes ") {
				t.Errorf("OpenMetrics scrape: %s, %q\n%s", resp.Status, resp.Header.Get("Content-Type"), b)
			}
		})
	}
	wg.Wait()
	if code, body := get("/", true); code != http.StatusOK || !strings.Contains(body, "backstop-exporter") || !strings.Contains(body, `href="/metrics"`) {
		t.Errorf("landing page: %d\n%s", code, body)
	}
	for _, p := range []string{"/-/healthy", "/-/ready"} {
		if code, body := get(p, true); code != http.StatusOK || body != "OK\n" {
			t.Errorf("%s: %d %q", p, code, body)
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
}

// Issue 42: the environment variables are BACKSTOP_<FLAG>, the names the
// CLI and the workers use (BACKSTOP_REDIS_URL); the exporter's old names,
// BACKSTOP_EXPORTER_<FLAG>, still work, with a deprecation line, and the
// new name wins over the old.
func TestEnvironmentNames(t *testing.T) {
	t.Setenv("BACKSTOP_QUEUES", "orders")
	t.Setenv("BACKSTOP_REDIS_URL", "redis://127.0.0.1:1/0")
	t.Setenv("BACKSTOP_EXPORTER_SCRAPE_TIMEOUT", "2s")
	t.Setenv("BACKSTOP_EXPORTER_QUEUES", "old")
	f, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f.queues != "orders" || f.redis.url != "redis://127.0.0.1:1/0" || f.timeout != 2*time.Second {
		t.Errorf("parsed queues %q, url %q, timeout %v", f.queues, f.redis.url, f.timeout)
	}
	want := [][2]string{{"BACKSTOP_EXPORTER_QUEUES", "BACKSTOP_QUEUES"}, {"BACKSTOP_EXPORTER_SCRAPE_TIMEOUT", "BACKSTOP_SCRAPE_TIMEOUT"}}
	if len(f.deprecated) != 2 || !slices.Contains(f.deprecated, want[0]) || !slices.Contains(f.deprecated, want[1]) {
		t.Errorf("deprecated %v, want %v", f.deprecated, want)
	}
}

// Issue 42: /-/ready answers 503 while the source does not (it said OK
// with Redis unreachable), and OK once it does; /-/healthy is OK all along.
func TestReadyFollowsTheSource(t *testing.T) {
	srv := redistest.Start(t)
	srv.Stop() // nothing listens on its port now
	f, err := parse([]string{"--queues=orders", "--redis.addr=" + srv.Addr, "--scrape.timeout=500ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, closeClient, err := f.newCollector(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeClient()
	h, err := f.handler(c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/-/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready") {
		t.Errorf("/-/ready with Redis down: %d %q", code, body)
	}
	if code, _ := get("/-/healthy"); code != http.StatusOK {
		t.Errorf("/-/healthy: %d", code)
	}
	srv.Restart()
	eventually.True(t, 10*time.Second, "/-/ready once Redis answers", func() bool {
		code, body := get("/-/ready")
		return code == http.StatusOK && body == "OK\n"
	})
}

// Issue 42: a build without -ldflags (go install) reports the build
// info's version, not an empty one.
func TestVersionFromBuildInfo(t *testing.T) {
	if version.Version == "" || !strings.Contains(version.Print(name), "version "+version.Version) {
		t.Errorf("version %q:\n%s", version.Version, version.Print(name))
	}
}
