package alerter

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// authAM answers POST /api/v2/alerts with 204 when the request carries
// want as its Authorization header, else 401 (as Alertmanager's
// --web.config.file does), and counts what it accepted.
func authAM(t *testing.T, want string, tls bool) (*httptest.Server, *int) {
	t.Helper()
	accepted := new(int)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want {
			w.Header().Set("WWW-Authenticate", "Basic")
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		*accepted++ // one post at a time: tick runs on the test's goroutine
		w.WriteHeader(http.StatusNoContent)
	})
	var srv *httptest.Server
	if tls {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return srv, accepted
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	must(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// Issue 40, fault 6: the credentials of --alertmanager.url were dropped
// from the requests (every post got 401, the page never arrived), and
// neither they nor those of an http_config file may show in a log line or
// an error.
func TestAlerterSendsCredentials(t *testing.T) {
	const secret = "hunter2-Pw0rd"
	basic := "Basic " + "YmFja3N0b3A6aHVudGVyMi1QdzByZA==" // backstop:hunter2-Pw0rd
	dir := t.TempDir()
	writeFile(t, dir, "password", secret+"\n")
	writeFile(t, dir, "token", "tok-"+secret)
	for _, tc := range []struct {
		name   string
		want   string // Authorization header
		tls    bool
		url    func(base string) string
		config string // http_config YAML, relative files in dir
	}{
		{name: "URL userinfo", want: basic,
			url: func(base string) string { return strings.Replace(base, "://", "://backstop:"+secret+"@", 1) }},
		{name: "URL userinfo, escaped", want: "Basic " + "YmFja3N0b3A6aHVudGVyMiVQdzByZA==", // backstop:hunter2%Pw0rd
			url: func(base string) string { return strings.Replace(base, "://", "://backstop:hunter2%25Pw0rd@", 1) }},
		{name: "basic_auth password_file", want: basic,
			config: "basic_auth:\n  username: backstop\n  password_file: password\n"},
		{name: "authorization bearer", want: "Bearer tok-" + secret,
			config: "authorization:\n  credentials_file: token\n"},
		{name: "basic auth over TLS with a CA file", want: basic, tls: true,
			config: "basic_auth:\n  username: backstop\n  password: " + secret + "\ntls_config:\n  ca_file: ca.pem\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redistest.Start(t).Client()
			am, accepted := authAM(t, tc.want, tc.tls)
			if tc.tls {
				writeFile(t, dir, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: am.Certificate().Raw})))
			}
			amURL := am.URL
			if tc.url != nil {
				amURL = tc.url(am.URL)
			}
			var opts []Option
			if tc.config != "" {
				cfg, err := LoadHTTPClientConfig(writeFile(t, dir, "http.yml", tc.config))
				must(t, err)
				opts = append(opts, WithHTTPClientConfig(cfg))
			}
			a, logs := newTestAlerter(t, rdb, amURL, opts...)
			ctx := context.Background()
			a.tick(ctx) // baseline
			addDeadLetter(t, rdb, "orders")
			a.tick(ctx)
			if *accepted != 1 {
				t.Errorf("Alertmanager accepted %d posts, want 1; logs:\n%s", *accepted, logs)
			}
			if strings.Contains(logs.String(), "hunter2") {
				t.Errorf("the log shows the password:\n%s", logs)
			}
		})
	}
}

// A refused post (401) is logged without the credentials that were sent.
func TestAlerterRefusedLogsNoSecret(t *testing.T) {
	rdb := redistest.Start(t).Client()
	am, _ := authAM(t, "Basic other", false)
	a, logs := newTestAlerter(t, rdb, strings.Replace(am.URL, "://", "://backstop:hunter2-Pw0rd@", 1), WithInterval(time.Second))
	ctx := context.Background()
	a.tick(ctx)
	addDeadLetter(t, rdb, "orders")
	a.tick(ctx)
	out := logs.String()
	if !strings.Contains(out, "401 Unauthorized") {
		t.Errorf("the refusal is not logged:\n%s", out)
	}
	if strings.Contains(out, "hunter2") {
		t.Errorf("the log shows the password:\n%s", out)
	}
}

// Bad URLs and configs are refused with errors that show no secret.
func TestAlerterConfigErrors(t *testing.T) {
	rdb := redistest.Start(t).Client()
	c := newTestCollector(t, rdb, exporter.QueueFor("orders"))
	dir := t.TempDir()
	for _, u := range []string{
		"http://backstop:hunter2%Pw0rd@am:9093", // unescaped %
		"http://backstop:hunter2 Pw0rd@am:9093", // a space
		"http://backstop:hunter2/Pw0rd@am:9093", // a / ends the host part: port "hunter2"
		"ftp://backstop:hunter2-Pw0rd@am:9093",
	} {
		_, err := New(c, u)
		if err == nil {
			t.Errorf("New(%q) accepted", u)
		} else if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "Pw0rd") {
			t.Errorf("New(%q): %v shows the password", u, err)
		}
	}
	cfg, err := LoadHTTPClientConfig(writeFile(t, dir, "basic.yml", "basic_auth:\n  username: backstop\n  password: x\n"))
	must(t, err)
	if _, err := New(c, "http://backstop:hunter2@am:9093", WithHTTPClientConfig(cfg)); err == nil || !strings.Contains(err.Error(), "both") {
		t.Errorf("credentials in the URL and the config: %v", err)
	}
	for name, yml := range map[string]string{
		"wrong type":    "basic_auth: hunter2-Pw0rd\n",
		"unknown key":   "basic_auth:\n  username: backstop\n  passwd: hunter2-Pw0rd\n",
		"two kinds":     "basic_auth:\n  username: backstop\n  password: hunter2-Pw0rd\nauthorization:\n  credentials: hunter2-Pw0rd\n",
		"password+file": "basic_auth:\n  username: backstop\n  password: hunter2-Pw0rd\n  password_file: pw\n",
	} {
		_, err := LoadHTTPClientConfig(writeFile(t, dir, "bad.yml", yml))
		if err == nil {
			t.Errorf("%s: loaded", name)
		} else if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v shows the password", name, err)
		}
	}
	if _, err := LoadHTTPClientConfig(filepath.Join(dir, "missing.yml")); err == nil || !strings.Contains(err.Error(), "missing.yml") {
		t.Errorf("missing file: %v", err)
	}
}
