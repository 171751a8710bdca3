package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// The password of the tests below, and the two halves that must never show
// in any output (a parse error may quote one side of a bad escape).
const (
	password  = "hunter2-Pw0rd"
	leakLeft  = "hunter2"
	leakRight = "Pw0rd"
)

// passwordForms are the password as a URL may carry it: as is, escaped
// (parses; decodes to a wrong password), the two forms that made net/url's
// error print the whole URL (issue 40, fault 7), and a slash, which ends
// the host part early (the port would be "hunter2").
var passwordForms = map[string]string{
	"plain":       password,
	"escaped":     "hunter2%25Pw0rd",
	"unescaped %": "hunter2%Pw0rd",
	"space":       "hunter2 Pw0rd",
	"slash":       "hunter2/Pw0rd", // ends the host part: the port would be "hunter2"
}

// parses reports whether a URL with this password form parses.
func parses(form string) bool { return form == "plain" || form == "escaped" }

// checkNoSecret fails t when out shows a part of the password.
func checkNoSecret(t *testing.T, what, out string) {
	t.Helper()
	for _, leak := range []string{leakLeft, leakRight} {
		if strings.Contains(out, leak) {
			t.Errorf("%s: the output shows %q:\n%s", what, leak, out)
			return
		}
	}
}

// TestAlerterPagesThroughBasicAuth (issue 40, fault 6): with Alertmanager
// behind basic auth (--web.config.file), the alerter's page is delivered,
// with the credentials in --alertmanager.url or in an http_config file
// (--alertmanager.config.file), and the exporter's output never shows the
// password. Before, the URL's credentials were dropped (401 on every post)
// and logged in plain text at start.
func TestAlerterPagesThroughBasicAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs in make test, not with -short")
	}
	for _, tc := range []struct {
		name string
		args func(dir, amAddr string) []string
	}{
		{"credentials in the URL", func(dir, amAddr string) []string {
			return []string{"--alertmanager.url=http://backstop:" + password + "@" + amAddr}
		}},
		{"http_config file (docs/monitoring.md's)", func(dir, amAddr string) []string {
			os.WriteFile(filepath.Join(dir, "alertmanager-password"), []byte(password+"\n"), 0o600)
			os.WriteFile(filepath.Join(dir, "alertmanager-http.yml"), []byte(docsFile(t, "alertmanager-http.yml")), 0o600)
			return []string{"--alertmanager.url=http://" + amAddr, "--alertmanager.config.file=" + filepath.Join(dir, "alertmanager-http.yml")}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			srv, rdb, q := startOrders(t)
			ctx := context.Background()
			hooks := newReceiver(t)
			amAddr := startAlertmanagerAuth(t, dir, hooks.addr, "backstop", password)
			if code := amAlerts(t, amAddr, "", "orders"); code != http.StatusUnauthorized {
				t.Fatalf("Alertmanager without credentials answered %d, want 401: basic auth is off", code)
			}
			startExporter(t, dir, srv.Addr, append(tc.args(dir, amAddr), "--alertmanager.interval=1s")...)
			stop := injectDeadLetters(t, ctx, rdb, q)
			defer stop()
			eventually.True(t, 30*time.Second, "the alert in Alertmanager (GET /api/v2/alerts with the credentials)", func() bool {
				return amAlerts(t, amAddr, password, "orders") == http.StatusOK
			})
			hooks.wait(t, 30*time.Second, "/pager", "firing", "BackstopDLQIngestion")
			stop()
			out, _ := os.ReadFile(filepath.Join(dir, "exporter.log"))
			if !strings.Contains(string(out), "alerter started") {
				t.Errorf("no start line in the exporter's log:\n%s", out)
			}
			checkNoSecret(t, "backstop-exporter", string(out))
		})
	}
}

// docsFile is the block of docs/monitoring.md marked <!-- snippet: file=name -->.
func docsFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(root + "/docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- snippet: file="+name+" -->\n```")
	_, rest, _ = strings.Cut(rest, "\n") // the fence's language
	block, _, closed := strings.Cut(rest, "\n```")
	if !ok || !closed {
		t.Fatalf("docs/monitoring.md has no block <!-- snippet: file=%s -->", name)
	}
	return block + "\n"
}

// amAlerts asks Alertmanager (as user backstop with password, unless
// empty) for its alerts: 200 when one is BackstopDLQIngestion for queue,
// 404 when none is, else the status.
func amAlerts(t *testing.T, amAddr, password, queue string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+amAddr+"/api/v2/alerts", nil)
	if password != "" {
		req.SetBasicAuth("backstop", password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode
	}
	var alerts []struct{ Labels map[string]string }
	if err := json.NewDecoder(resp.Body).Decode(&alerts); err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		if a.Labels["alertname"] == "BackstopDLQIngestion" && a.Labels["queue"] == queue {
			return http.StatusOK
		}
	}
	return http.StatusNotFound
}

// TestNoSecretInOutput (issue 40, faults 6 and 7; SPEC-40 item 11) runs the
// backstop CLI and backstop-exporter, as built, with every flag that takes
// a URL carrying the password in each of its forms (parseable or not),
// against an unreachable address and a real server (Redis with
// requirepass, RabbitMQ with a user of that password, Alertmanager with
// basic auth), and greps everything they print for the password.
func TestNoSecretInOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs in make test, not with -short")
	}
	cli, exp := build(t, "backstop"), build(t, "backstop-exporter")
	ctx := context.Background()
	const unreachable = "127.0.0.1:1"

	srv := redistest.Start(t)
	if err := srv.Client().ConfigSet(ctx, "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: password})
	t.Cleanup(func() { rdb.Close() })
	broker := rabbittest.Start(t)
	amqpHost, mgmtHost := hostOf(t, broker.URL()), hostOf(t, broker.ManagementURL())
	addRabbitUser(t, broker.ManagementURL(), "backstop", password)
	hooks := newReceiver(t)
	amAddr := startAlertmanagerAuth(t, t.TempDir(), hooks.addr, "backstop", password)

	// The CLI: every form, unreachable and reachable.
	for name, pw := range passwordForms {
		for _, host := range []string{unreachable, srv.Addr} {
			redisURL := "redis://:" + pw + "@" + host + "/0"
			for _, args := range [][]string{
				{"queue", "stats", "--queue", "orders", "--redis.url", redisURL},
				{"dlq", "inspect", "--queue", "orders", "--redis.url", redisURL},
			} {
				out := runCommand(t, cli, nil, args...)
				checkNoSecret(t, fmt.Sprintf("backstop %s %s, password %s, %s", args[0], args[1], name, host), out)
				if name == "plain" && host == srv.Addr && !strings.Contains(out, "queue orders") && !strings.Contains(out, "dead letters") {
					t.Errorf("backstop %s with the right password did not reach Redis:\n%s", args[:2], out)
				}
			}
			// The same URL from the environment.
			out := runCommand(t, cli, []string{"BACKSTOP_REDIS_URL=" + redisURL}, "queue", "stats", "--queue", "orders")
			checkNoSecret(t, fmt.Sprintf("backstop queue stats, BACKSTOP_REDIS_URL, password %s, %s", name, host), out)
		}
		for _, host := range []string{unreachable, amqpHost} {
			amqpURL := "amqp://backstop:" + pw + "@" + host + "/"
			mgmt := "http://backstop:" + pw + "@" + mgmtHost
			for _, args := range [][]string{
				{"queue", "stats", "--queue", "orders", "--amqp.url", amqpURL, "--rabbitmq.management-url", mgmt},
				{"dlq", "inspect", "--queue", "orders", "--amqp.url", amqpURL},
			} {
				out := runCommand(t, cli, nil, args...)
				checkNoSecret(t, fmt.Sprintf("backstop %s %s --amqp.url, password %s, %s", args[0], args[1], name, host), out)
				if name == "plain" && host == amqpHost && strings.Contains(out, "cannot reach") {
					t.Errorf("backstop %s with the right password did not reach RabbitMQ:\n%s", args[:2], out)
				}
			}
		}
		demo := runCommand(t, cli, nil, "demo", "--redis.url", "redis://:"+pw+"@"+srv.Addr+"/0", "--jobs", "3", "--listen", "127.0.0.1:0")
		checkNoSecret(t, "backstop demo --redis.url, password "+name, demo)
	}

	// The exporter: --redis.url in each mode, --rabbitmq.url,
	// --alertmanager.url (with a dead letter to post).
	goodRedis := "--redis.url=redis://:" + password + "@" + srv.Addr + "/0"
	n := 0
	for name, pw := range passwordForms {
		for _, host := range []string{unreachable, srv.Addr} {
			for _, mode := range []string{"standalone", "cluster", "sentinel"} {
				if mode != "standalone" && (parses(name) || host != unreachable) {
					continue // the modes differ in parsing only
				}
				out := runExporter(t, exp, nil, "--redis.mode="+mode, "--redis.sentinel-master=m",
					"--redis.url=redis://:"+pw+"@"+host+"/0", "--queues=orders")
				checkNoSecret(t, fmt.Sprintf("backstop-exporter --redis.url (%s), password %s, %s", mode, name, host), out)
			}
		}
		for _, host := range []string{unreachable, mgmtHost} {
			out := runExporter(t, exp, nil, "--rabbitmq.url=http://backstop:"+pw+"@"+host, "--queues=orders")
			checkNoSecret(t, fmt.Sprintf("backstop-exporter --rabbitmq.url, password %s, %s", name, host), out)
		}
		for _, host := range []string{unreachable, amAddr} {
			n++
			queue := fmt.Sprintf("alerted-%d", n)
			q := redisqueue.New(rdb, queue)
			if err := q.EnsureGroup(ctx); err != nil {
				t.Fatal(err)
			}
			posted := func(exporterAddr string) bool { // wait for a post (or its failure), dead-lettering meanwhile
				deadLetter(t, ctx, rdb, q, fmt.Sprintf("job-%d", time.Now().UnixNano()))
				return amAlerts(t, amAddr, password, queue) == http.StatusOK || alerterErrors(t, exporterAddr) > 0
			}
			out := runExporter(t, exp, posted, goodRedis, "--queues="+queue, "--alertmanager.interval=200ms",
				"--alertmanager.url=http://backstop:"+pw+"@"+host)
			checkNoSecret(t, fmt.Sprintf("backstop-exporter --alertmanager.url, password %s, %s", name, host), out)
			if name == "plain" && host == amAddr && amAlerts(t, amAddr, password, queue) != http.StatusOK {
				t.Errorf("the alerter with the right password did not page:\n%s", out)
			}
		}
	}
}

// runCommand runs bin with args (and env added) and returns its stdout and
// stderr.
func runCommand(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Errorf("%s %q did not end within 60s:\n%s", filepath.Base(bin), args, out)
	}
	return string(out)
}

// runExporter runs backstop-exporter with args until it exits by itself (a
// flag it refuses) or, once its metrics answer, until until(its address)
// holds (nil: one scrape); then stops it and returns all it printed.
func runExporter(t *testing.T, bin string, until func(addr string) bool, args ...string) string {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(bin, append(args, "--web.listen-address="+addr, "--log.level=debug")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	ready := func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	}
	if eventually.Wait(60*time.Second, ready) != nil {
		t.Errorf("backstop-exporter %q neither served nor exited", args)
	}
	select {
	case <-exited:
		return out.String()
	default:
	}
	if until != nil && eventually.Wait(30*time.Second, func() bool { return until(addr) }) != nil {
		t.Errorf("backstop-exporter %q: the alerter did not post", args)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-exited
	}
	return out.String()
}

// alerterErrors is the exporter's backstop_alerter_errors_total of kind
// alertmanager.
func alerterErrors(t *testing.T, exporterAddr string) float64 {
	resp, err := http.Get("http://" + exporterAddr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, `backstop_alerter_errors_total{kind="alertmanager"} `); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// hostOf is the host:port of URL s.
func hostOf(t *testing.T, s string) string {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// addRabbitUser adds user, with password, full rights on vhost / and the
// monitoring tag (the exporter reads the management API), through the
// management API at mgmt (guest/guest).
func addRabbitUser(t *testing.T, mgmt, user, password string) {
	t.Helper()
	put := func(path, body string) {
		req, _ := http.NewRequest(http.MethodPut, strings.TrimRight(mgmt, "/")+path, strings.NewReader(body))
		req.SetBasicAuth("guest", "guest")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("PUT %s: %s", path, resp.Status)
		}
	}
	b, _ := json.Marshal(map[string]string{"password": password, "tags": "monitoring"})
	put("/api/users/"+user, string(b))
	put("/api/permissions/%2F/"+user, `{"configure":".*","write":".*","read":".*"}`)
}
