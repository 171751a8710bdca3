// Package e2e proves the path from a dead letter to a page with real parts:
// redis-server, backstop-exporter, Prometheus running the generated rules
// and Alertmanager running the shipped example configuration, all on
// loopback ports, and a webhook receiver in the test.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
	"github.com/backstop-dev/backstop/rules"
)

const root = "../../.."

func TestDeadLettersPageAndResolve(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs in make test, not with -short")
	}
	ctx := context.Background()
	rdb, q, hooks, _ := startRulesPath(t)

	started := time.Now()
	stop := injectDeadLetters(t, ctx, rdb, q)
	page := hooks.wait(t, 120*time.Second, "/pager", "firing", "BackstopDLQIngestion")
	pageLatency := time.Since(started)
	stop()
	if page.Labels["queue"] != "orders" || page.Labels["severity"] != "critical" || page.Annotations["runbook_url"] == "" {
		t.Errorf("page: %+v", page)
	}
	stopped := time.Now()
	hooks.wait(t, 120*time.Second, "/pager", "resolved", "BackstopDLQIngestion")
	t.Logf("dead letter → page: %s; injection stopped → resolved: %s", pageLatency.Round(100*time.Millisecond), time.Since(stopped).Round(100*time.Millisecond))
	ticket := hooks.wait(t, 10*time.Second, "/ticket", "firing", "BackstopDeadLetter")
	if ticket.Labels["queue"] != "orders" || ticket.Labels["severity"] != "warning" {
		t.Errorf("ticket: %+v", ticket)
	}
}

// TestAlerterPagesFaster runs the alerter path alone: backstop-exporter
// with --alertmanager.url posts BackstopDLQIngestion to the real
// Alertmanager itself, with no Prometheus, so the latency measured is the
// alerter's (read interval + Alertmanager's group_wait), not the rules'.
// TestDeadLettersPageAndResolve measures the rules path in the same run.
func TestAlerterPagesFaster(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs in make test, not with -short")
	}
	dir := t.TempDir()
	srv, rdb, q := startOrders(t)
	ctx := context.Background()
	// A dead letter from before the exporter started: it must not page.
	deadLetter(t, ctx, rdb, q, "old")

	hooks := newReceiver(t)
	amAddr := startAlertmanager(t, dir, hooks.addr)
	exporterAddr := startExporter(t, dir, srv.Addr,
		"--alertmanager.url=http://"+amAddr, "--alertmanager.interval=1s", "--alertmanager.resolve-after=3s")

	// Let the alerter take its baseline and read again, and check the old
	// dead letter did not page. Nothing else reads the DLQ here (no
	// Prometheus scrapes), so Redis counts the alerter's reads: after three
	// more, the post of any read past the baseline has reached Alertmanager.
	reads := commandCalls(t, ctx, rdb, "xinfo|stream")
	eventually.True(t, 30*time.Second, "three more alerter reads", func() bool {
		return commandCalls(t, ctx, rdb, "xinfo|stream") >= reads+3
	})
	amResp, err := http.Get("http://" + amAddr + "/api/v2/alerts")
	if err != nil {
		t.Fatal(err)
	}
	active, _ := io.ReadAll(amResp.Body)
	amResp.Body.Close()
	hooks.mu.Lock()
	early := append([]notification(nil), hooks.got...)
	hooks.mu.Unlock()
	if strings.TrimSpace(string(active)) != "[]" || len(early) != 0 {
		t.Fatalf("paged for dead letters older than the exporter: alertmanager has %s, receiver got %+v", active, early)
	}

	started := time.Now()
	stop := injectDeadLetters(t, ctx, rdb, q)
	page := hooks.wait(t, 30*time.Second, "/pager", "firing", "BackstopDLQIngestion")
	pageLatency := time.Since(started)
	stop()
	want := map[string]string{"alertname": "BackstopDLQIngestion", "severity": "critical", "queue": "orders"}
	if len(page.Labels) != len(want) || page.Labels["queue"] != "orders" || page.Labels["severity"] != "critical" {
		t.Errorf("page labels %v, want exactly %v", page.Labels, want)
	}
	if page.Annotations["runbook_url"] == "" || page.Annotations["dashboard_url"] == "" || page.Annotations["summary"] == "" {
		t.Errorf("page annotations: %+v", page.Annotations)
	}
	stopped := time.Now()
	hooks.wait(t, 30*time.Second, "/pager", "resolved", "BackstopDLQIngestion")
	t.Logf("alerter: dead letter → page: %s; injection stopped → resolved: %s (resolve-after 3s)", pageLatency.Round(100*time.Millisecond), time.Since(stopped).Round(100*time.Millisecond))

	// The exporter reports the alerter's errors: none here.
	resp, err := http.Get("http://" + exporterAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range []string{`backstop_alerter_errors_total{kind="alertmanager"} 0`, `backstop_alerter_errors_total{kind="redis"} 0`} {
		if !strings.Contains(string(body), line) {
			t.Errorf("metrics lack %q", line)
		}
	}
}

// startRulesPath starts the rules path for queue orders: redis-server,
// backstop-exporter, Alertmanager (the shipped configuration) notifying a
// receiver in the test, and Prometheus (the generated rules). It returns
// the address of Prometheus too, for its query API.
func startRulesPath(t *testing.T) (rdb *redis.Client, q *redisqueue.Queue, hooks *receiver, promAddr string) {
	t.Helper()
	dir := t.TempDir()
	srv, rdb, q := startOrders(t)
	hooks = newReceiver(t)
	exporterAddr := startExporter(t, dir, srv.Addr)
	amAddr := startAlertmanager(t, dir, hooks.addr)
	return rdb, q, hooks, startPrometheus(t, dir, exporterAddr, amAddr)
}

// startOrders starts a redis-server with the consumer group of queue
// orders.
func startOrders(t *testing.T) (*redistest.Server, *redis.Client, *redisqueue.Queue) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client()
	q := redisqueue.New(rdb, "orders")
	if err := q.EnsureGroup(context.Background()); err != nil {
		t.Fatal(err)
	}
	return srv, rdb, q
}

// injectDeadLetters dead-letters a job of q every 100 ms until the
// returned stop is called.
func injectDeadLetters(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue) (stop func()) {
	return every100ms(func(i int) bool {
		deadLetter(t, ctx, rdb, q, fmt.Sprintf("order-%d", i))
		return true
	})
}

// every100ms calls f(0), f(1)... every 100 ms until f returns false or the
// returned stop is called (stop waits for the call in progress, and may be
// called more than once).
func every100ms(f func(i int) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if !f(i) {
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }); wg.Wait() }
}

func deadLetter(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, id string) {
	if _, err := q.Enqueue(ctx, id, []byte("{}")); err != nil {
		t.Error(err)
		return
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.Group(), Consumer: "e2e", Streams: []string{q.Keys().Jobs, ">"}, Count: 1}).Result()
	if err != nil || len(res) == 0 || len(res[0].Messages) == 0 {
		t.Errorf("read: %v", err)
		return
	}
	if _, err := q.DeadLetter(ctx, res[0].Messages[0].ID, "permanent_error", "HTTP 400"); err != nil {
		t.Error(err)
	}
}

// receiver is the webhook receiver Alertmanager notifies.
type receiver struct {
	addr string
	mu   sync.Mutex
	got  []notification
}

type notification struct {
	path   string
	status string
	alert  alert
}

type alert struct {
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = l.Addr().String()
	s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var msg struct {
			Alerts []alert `json:"alerts"`
		}
		if err := json.NewDecoder(req.Body).Decode(&msg); err != nil {
			t.Errorf("webhook: %v", err)
			return
		}
		r.mu.Lock()
		for _, a := range msg.Alerts {
			r.got = append(r.got, notification{path: req.URL.Path, status: a.Status, alert: a})
		}
		r.mu.Unlock()
	})}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return r
}

func (r *receiver) wait(t *testing.T, limit time.Duration, path, status, alertname string) alert {
	t.Helper()
	var found *alert
	find := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, n := range r.got {
			if n.path == path && n.status == status && n.alert.Labels["alertname"] == alertname {
				found = &n.alert
				return true
			}
		}
		return false
	}
	if eventually.Wait(limit, find) != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("no %s %s notification of %s within %s; got %+v", path, status, alertname, limit, r.got)
	}
	return *found
}

// commandCalls is how many times Redis has run command (as INFO
// commandstats names it, "xinfo|stream"), for a test that waits on reads.
func commandCalls(t *testing.T, ctx context.Context, rdb *redis.Client, command string) int64 {
	t.Helper()
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":calls=")
		if ok {
			n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			return n
		}
	}
	return 0
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func need(t *testing.T, name, pkg string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: run `make test`, which installs the Debian package %s", name, pkg)
	}
	return p
}

// start runs a process until the test ends and waits for its HTTP
// readiness path.
func start(t *testing.T, dir, name, readyURL string, bin string, args ...string) {
	t.Helper()
	log, _ := os.Create(filepath.Join(dir, name+".log"))
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := func() bool {
		resp, err := http.Get(readyURL)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	if eventually.Wait(60*time.Second, ready) != nil {
		out, _ := os.ReadFile(filepath.Join(dir, name+".log"))
		t.Fatalf("%s not ready at %s:\n%s", name, readyURL, out)
	}
}

func startExporter(t *testing.T, dir, redisAddr string, extraArgs ...string) string {
	bin := build(t, "backstop-exporter")
	addr := freeAddr(t)
	args := append([]string{"--redis.addr=" + redisAddr, "--queues=orders", "--web.listen-address=" + addr}, extraArgs...)
	start(t, dir, "exporter", "http://"+addr+"/-/ready", bin, args...)
	return addr
}

// startAlertmanager runs the shipped example configuration with the
// receivers pointed at the test and the group waits shortened.
func startAlertmanager(t *testing.T, dir, hooks string) string {
	return startAlertmanagerAuth(t, dir, hooks, "", "")
}

// startAlertmanagerAuth is startAlertmanager with basic auth on every
// path (--web.config.file, a bcrypt hash of password) when user is not
// empty.
func startAlertmanagerAuth(t *testing.T, dir, hooks, user, password string) string {
	bin := need(t, "prometheus-alertmanager", "prometheus-alertmanager")
	b, err := os.ReadFile(root + "/rules/alertmanager.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	route := cfg["route"].(map[string]any)
	route["group_wait"], route["group_interval"] = "1s", "1s"
	for _, r := range route["routes"].([]any) {
		r.(map[string]any)["group_wait"] = "1s"
	}
	for _, r := range cfg["receivers"].([]any) {
		for _, w := range r.(map[string]any)["webhook_configs"].([]any) {
			wc := w.(map[string]any)
			wc["url"] = strings.Replace(wc["url"].(string), "127.0.0.1:5001", hooks, 1)
		}
	}
	out, _ := yaml.Marshal(cfg)
	os.WriteFile(filepath.Join(dir, "alertmanager.yml"), out, 0o644)
	addr := freeAddr(t)
	args := []string{"--config.file=alertmanager.yml", "--storage.path=am-data", "--web.listen-address=" + addr, "--cluster.listen-address="}
	ready := "http://" + addr + "/-/ready"
	if user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "am-web.yml"), []byte("basic_auth_users:\n  "+user+": "+string(hash)+"\n"), 0o600)
		args = append(args, "--web.config.file=am-web.yml")
		ready = "http://" + url.UserPassword(user, password).String() + "@" + addr + "/-/ready"
	}
	start(t, dir, "alertmanager", ready, bin, args...)
	return addr
}

// startPrometheus scrapes and evaluates every second, with the rules the
// generator writes for a configuration whose windows fit a test: the same
// expressions as the shipped rules, shorter durations. services are
// processes exporting backstop_client_* (job "checkout"). It returns
// Prometheus's address, for its query API.
func startPrometheus(t *testing.T, dir, exporterAddr, amAddr string, services ...string) string {
	bin := need(t, "prometheus", "prometheus")
	c := rules.Default()
	c.DLQRateWindow, c.DLQPageFor, c.DownFor, c.RetryRatioFor, c.DeadLetterFor = "10s", "3s", "10s", "3s", "2s"
	files, err := rules.Files(c)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [backstop.rules.yml, backstop.alerts.yml]
alerting:
  alertmanagers:
    - static_configs: [{targets: [%q]}]
scrape_configs:
  - job_name: backstop
    static_configs: [{targets: [%q]}]
`, amAddr, exporterAddr)
	if len(services) > 0 {
		cfg += fmt.Sprintf("  - job_name: checkout\n    static_configs: [{targets: [\"%s\"]}]\n", strings.Join(services, `", "`))
	}
	os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644)
	addr := freeAddr(t)
	start(t, dir, "prometheus", "http://"+addr+"/-/ready", bin,
		"--config.file=prometheus.yml", "--storage.tsdb.path=prom-data", "--web.listen-address="+addr,
		"--rules.alert.resend-delay=1s")
	return addr
}
