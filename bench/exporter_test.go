package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// BenchmarkExporterScrape runs the real backstop-exporter binary against
// a real redis-server and times one HTTP scrape of it with gzip, as
// Prometheus makes it, for 10, 100 and 1,000 queues whose keys hold 10 or
// 1,000,000 entries each. It reports per scrape the commands Redis ran
// (INFO commandstats), the collector's own time (backstop_scrape_duration_seconds:
// the Redis pipeline and building the samples; the rest is the registry,
// text encoding and gzip) and the size sent, the exporter's own CPU time
// (cpu-ms/scrape, from /proc) against Redis's (cpu-x-redis), and the
// exporter's peak RSS (VmHWM) after the scrapes.
//
// Each case runs exporter=tree, this tree's build; with
// BACKSTOP_BENCH_BASE=/path/to/backstop-exporter it first runs that build
// as exporter=base, over the same queues and redis-server:
//
//	git worktree add /tmp/base HEAD && (cd /tmp/base && go build -o /tmp/exporter-base ./cmd/backstop-exporter)
//	BACKSTOP_BENCH_BASE=/tmp/exporter-base go test -run '^$' -bench 'ExporterScrape/^entries=10$/^queues=1000$' -benchtime 20x ./bench/
//
// With BACKSTOP_BENCH_REDIS_EXPORTER=/path/to/redis_exporter, each
// entries=10 case also runs vs=redis_exporter (see vsRedisExporter):
//
//	BACKSTOP_BENCH_REDIS_EXPORTER=/tmp/redis_exporter go test -run '^$' -bench 'ExporterScrape/^entries=10$/^queues=1000$/vs=' -benchtime 20x ./bench/
//
// Every queue has the default layout: a jobs stream with the group
// "workers", a delayed set, a DLQ stream and a stats hash.
//
//   - entries=10: distinct queues of 10 jobs (2 pending), 3 delayed jobs,
//     2 dead letters and a stats hash each.
//   - entries=1000000: 1,000 queues of 1,000,000 entries each would need
//     some 300 GB, so 10 distinct big queues are built (each: a jobs stream
//     of 1,000,000 entries with 10,000 pending, a delayed set of 1,000,000
//     members, half of them overdue, a DLQ of 1,000,000 entries, a stats
//     hash), filled by a Lua loop in chunks of 100,000 (about 45 s and 3 GB
//     in all); queue i of the benchmark reads the keys of big queue i%10
//     under its own name (--queues.config). Redis does the same work per
//     command as for distinct keys of that size (every command is O(1) or
//     O(log n) plus a bounded reply); only its CPU caches are warmer.
func BenchmarkExporterScrape(b *testing.B) {
	srv := redistest.Start(b)
	rdb, admin := srv.Client(), srv.Client()
	// exporter=tree is this tree's; BACKSTOP_BENCH_BASE names another
	// build (say, of the last commit) to run beside it, in turn, so a
	// change is measured against its base on the same machine and load.
	exporters := []struct{ name, bin string }{{"tree", buildExporter(b)}}
	if base := os.Getenv("BACKSTOP_BENCH_BASE"); base != "" {
		exporters = append([]struct{ name, bin string }{{"base", base}}, exporters...)
	}
	var bigNames []string
	for _, entries := range []int{10, 1_000_000} {
		for _, n := range []int{10, 100, 1000, 10_000} {
			if entries > 10 && n > 1000 {
				continue // 10 big key sets read under 10,000 names add nothing to the 1,000 case
			}
			b.Run(fmt.Sprintf("entries=%d/queues=%d", entries, n), func(b *testing.B) {
				var qs []exporter.Queue
				if entries == 10 {
					qs = smallQueues(b, rdb, n)
				} else {
					if bigNames == nil {
						bigNames = bigQueues(b, rdb, 10, entries)
					}
					for i := range n {
						q := exporter.QueueFor("b" + strconv.Itoa(i))
						q.Keys = redisqueue.KeysFor(bigNames[i%len(bigNames)])
						qs = append(qs, q)
					}
				}
				for _, ex := range exporters {
					b.Run("exporter="+ex.name, func(b *testing.B) {
						e := startExporter(b, ex.bin, srv.Addr, qs)
						size := scrape(b, e.url) // warm: connections, buffers
						resetStats(b, admin)
						cpu := e.cpuTime(b)
						b.ResetTimer()
						for b.Loop() {
							scrape(b, e.url)
						}
						b.StopTimer()
						cpuMs := float64(e.cpuTime(b)-cpu) / float64(time.Millisecond) / float64(b.N)
						calls, usec := commands(b, admin)
						b.ReportMetric(float64(calls)/float64(b.N), "cmds/scrape")
						// Redis's own CPU time for the scrape's commands, and the
						// whole HTTP scrape as a multiple of it (issue 14: ≤ 2×).
						redisMs := float64(usec) / 1000 / float64(b.N)
						b.ReportMetric(redisMs, "redis-ms/scrape")
						b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/redisMs, "x-redis")
						// The exporter's own CPU time, which a busy machine
						// inflates less than the wall-clock time.
						b.ReportMetric(cpuMs, "cpu-ms/scrape")
						b.ReportMetric(cpuMs/redisMs, "cpu-x-redis")
						b.ReportMetric(float64(size)/1024, "gzip-KiB/scrape")
						b.ReportMetric(e.collectSeconds(b)*1000, "collect-ms")
						b.ReportMetric(float64(e.peakRSS(b))/(1<<20), "peak-RSS-MiB")
					})
				}
				if re := os.Getenv("BACKSTOP_BENCH_REDIS_EXPORTER"); re != "" && entries == 10 {
					// redis_exporter reads keys by their own names only, so
					// not the big key sets read under 1,000 names.
					b.Run("vs=redis_exporter", func(b *testing.B) {
						vsRedisExporter(b, exporters[len(exporters)-1].bin, re, srv.Addr, admin, qs)
					})
				}
			})
		}
	}
}

// vsRedisExporter scrapes this tree's exporter (bs-) and redis_exporter
// --check-streams --check-keys (re-) over the same queues and redis-server
// in turn, alternating which goes first, and reports for each the wall
// time of one HTTP scrape with gzip, the commands Redis ran for it and
// Redis's CPU time in them (INFO commandstats, reset before each scrape),
// and the exporter's own CPU time (/proc); speedup is re-ms over bs-ms.
// The commands that cost Redis the most are logged for each.
func vsRedisExporter(b *testing.B, tree, reBin, redisAddr string, admin *redis.Client, qs []exporter.Queue) {
	type side struct {
		name        string
		e           *runningExporter
		wall, cpu   time.Duration
		calls, usec int64
		byCmd       map[string]commandStat
	}
	sides := []*side{
		{name: "bs", e: startExporter(b, tree, redisAddr, qs)},
		// The patterns match the four keys of every queue and nothing else
		// in this redis-server; redis_exporter finds them with SCAN.
		{name: "re", e: runServer(b, reBin, "/health", "--redis.addr=redis://"+redisAddr,
			"--check-streams={*}:jobs,{*}:dlq", "--check-keys={*}:delayed,{*}:stats", "--log-level=warn")},
	}
	// Both must report every queue, or the comparison is of less work.
	if n := countLines(b, sides[0].e.url, "backstop_dlq_size{"); n != len(qs) {
		b.Fatalf("backstop exporter reports %d DLQs, want %d", n, len(qs))
	}
	if n := countLines(b, sides[1].e.url, "redis_stream_length{"); n != 2*len(qs) {
		b.Fatalf("redis_exporter reports %d streams, want %d", n, 2*len(qs))
	}
	if n := countLines(b, sides[1].e.url, "redis_key_size{"); n != 2*len(qs) {
		b.Fatalf("redis_exporter reports %d key sizes, want %d", n, 2*len(qs))
	}
	for _, s := range sides {
		scrape(b, s.e.url) // warm
		s.cpu = -s.e.cpuTime(b)
		s.byCmd = map[string]commandStat{}
	}
	i := 0
	for b.Loop() {
		for j := range sides {
			s := sides[(i+j)%2]
			resetStats(b, admin)
			start := time.Now()
			scrape(b, s.e.url)
			s.wall += time.Since(start)
			for name, c := range commandStats(b, admin) {
				s.calls += c.calls
				s.usec += c.usec
				t := s.byCmd[name]
				s.byCmd[name] = commandStat{t.calls + c.calls, t.usec + c.usec}
			}
		}
		i++
	}
	b.StopTimer()
	n := float64(b.N)
	for _, s := range sides {
		s.cpu += s.e.cpuTime(b)
		b.ReportMetric(float64(s.wall.Microseconds())/1000/n, s.name+"-ms/scrape")
		b.ReportMetric(float64(s.usec)/1000/n, s.name+"-redis-ms/scrape")
		b.ReportMetric(float64(s.calls)/n, s.name+"-cmds/scrape")
		b.ReportMetric(float64(s.cpu.Microseconds())/1000/n, s.name+"-cpu-ms/scrape")
		b.ReportMetric(float64(s.e.peakRSS(b))/(1<<20), s.name+"-peak-RSS-MiB")
		names := make([]string, 0, len(s.byCmd))
		for name := range s.byCmd {
			names = append(names, name)
		}
		slices.SortFunc(names, func(x, y string) int { return cmp.Compare(s.byCmd[y].usec, s.byCmd[x].usec) })
		var top strings.Builder
		for _, name := range names[:min(6, len(names))] {
			c := s.byCmd[name]
			fmt.Fprintf(&top, " %s %.0f×%.2fms", name, float64(c.calls)/n, float64(c.usec)/1000/n)
		}
		b.Logf("%s per scrape, Redis's costliest commands (calls×CPU):%s", s.name, top.String())
	}
	b.ReportMetric(float64(sides[1].wall)/float64(sides[0].wall), "speedup")
}

// countLines scrapes url (decompressed) and counts the lines that start
// with prefix.
func countLines(b *testing.B, url, prefix string) int {
	b.Helper()
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(nil, 1<<20)
	n := 0
	for s.Scan() {
		if strings.HasPrefix(s.Text(), prefix) {
			n++
		}
	}
	return n
}

// smallQueues makes queues s0..s(n-1) of 10 entries each (idempotent).
func smallQueues(b *testing.B, rdb redis.UniversalClient, n int) []exporter.Queue {
	b.Helper()
	ctx := context.Background()
	var qs []exporter.Queue
	for i := range n {
		q := exporter.QueueFor("s" + strconv.Itoa(i))
		qs = append(qs, q)
		if rdb.Exists(ctx, q.Keys.Stats).Val() == 1 {
			continue
		}
		p := rdb.Pipeline()
		p.XGroupCreateMkStream(ctx, q.Keys.Jobs, "workers", "0")
		for range 10 {
			p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys.Jobs, Values: []string{"id", "j", "attempt", "1", "payload", payload}})
		}
		p.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys.Jobs, ">"}, Count: 2, Block: -1})
		now := float64(time.Now().UnixMilli())
		p.ZAdd(ctx, q.Keys.Delayed, redis.Z{Score: now - 1000, Member: "a"}, redis.Z{Score: now, Member: "b"}, redis.Z{Score: now + 1e6, Member: "c"})
		p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys.DLQ, Values: []string{"reason", "permanent_error", "payload", payload}})
		p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys.DLQ, Values: []string{"reason", "crash_loop", "payload", payload}})
		p.HSet(ctx, q.Keys.Stats, stats)
		if _, err := p.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return qs
}

var payload = strings.Repeat("x", 64)

// stats is a stats hash as the scripts leave it after some traffic.
var stats = map[string]any{
	"enqueued": 1000, "promoted": 120, "reclaimed": 3, "replayed": 0, "max_attempts_reached": 4,
	"attempts:success": 950, "attempts:retry": 130, "attempts:dead_letter": 10,
	"retries:transient": 100, "retries:retry_after": 30, "dead_letters:permanent_error": 6, "dead_letters:max_attempts_reached": 4,
	"finished:success:1": 850, "finished:success:2": 80, "finished:success:3": 20, "finished_sum:success": 1070,
	"finished:dead_letter:1": 6, "finished:dead_letter:5": 4, "finished_sum:dead_letter": 26,
}

// fillScript appends ARGV[1] entries to the jobs stream KEYS[1] and the DLQ
// KEYS[3], and as many members to the delayed set KEYS[2], due from
// ARGV[2] (unix ms) on, one ms apart: Redis builds a million entries in
// about a second, with no network in between.
var fillScript = redis.NewScript(`
local n, due, base, payload = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
for i = 1, n do
  local id = 'job-' .. (base + i)
  redis.call('XADD', KEYS[1], '*', 'id', id, 'attempt', '1', 'first_enqueued_ms', '1700000000000', 'payload', payload)
  redis.call('ZADD', KEYS[2], due + base + i, id)
  redis.call('XADD', KEYS[3], '*', 'reason', 'permanent_error', 'id', id, 'attempt', '3', 'payload', payload)
end
return n`)

// bigQueues builds k queues of entries entries each (see the benchmark's
// doc) and returns their names.
func bigQueues(b *testing.B, rdb redis.UniversalClient, k, entries int) []string {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	var names []string
	for i := range k {
		name := "big" + strconv.Itoa(i)
		keys := redisqueue.KeysFor(name)
		due := time.Now().UnixMilli() - int64(entries/2) // half overdue
		for done := 0; done < entries; done += 100_000 {
			n := min(100_000, entries-done)
			if err := fillScript.Run(ctx, rdb, []string{keys.Jobs, keys.Delayed, keys.DLQ}, n, due, done, payload).Err(); err != nil {
				b.Fatal(err)
			}
		}
		if err := rdb.XGroupCreate(ctx, keys.Jobs, "workers", "0").Err(); err != nil {
			b.Fatal(err)
		}
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{keys.Jobs, ">"}, Count: 10_000, Block: -1}).Err(); err != nil {
			b.Fatal(err)
		}
		if err := rdb.HSet(ctx, keys.Stats, stats).Err(); err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
	}
	mem, _ := rdb.Info(ctx, "memory").Result()
	b.Logf("built %d queues of %d entries in %v; redis %s", k, entries, time.Since(start).Round(time.Second), infoField(mem, "used_memory_human"))
	return names
}

func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// scrape GETs url asking for gzip, as Prometheus does, and returns the
// size of the compressed exposition. Asking explicitly keeps the client
// from decompressing (Prometheus would, in its own process).
func scrape(b *testing.B, url string) int64 {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("scrape: %s, %v", resp.Status, err)
	}
	return n
}

func resetStats(b *testing.B, admin *redis.Client) {
	if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
}

// commands sums INFO commandstats calls and usec (Redis's CPU time in
// them), leaving out this benchmark's CONFIG RESETSTAT. INFO stays in:
// the exporter sends one per scrape, and this INFO is not counted in its
// own reply.
func commands(b *testing.B, admin *redis.Client) (calls, usec int64) {
	for _, c := range commandStats(b, admin) {
		calls += c.calls
		usec += c.usec
	}
	return calls, usec
}

type commandStat struct{ calls, usec int64 }

// commandStats returns INFO commandstats by command ("xinfo|stream"),
// without this benchmark's CONFIG RESETSTAT (Redis 7 counts subcommands
// apart, so an exporter's CONFIG GET stays in).
func commandStats(b *testing.B, admin *redis.Client) map[string]commandStat {
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	stats := map[string]commandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		name = strings.TrimPrefix(name, "cmdstat_")
		if !ok || name == "config|resetstat" || name == "config" {
			continue
		}
		var c commandStat
		n, rest, _ := strings.Cut(rest, ",")
		c.calls, _ = strconv.ParseInt(n, 10, 64)
		if _, u, ok := strings.Cut(rest, "usec="); ok {
			u, _, _ = strings.Cut(u, ",")
			c.usec, _ = strconv.ParseInt(u, 10, 64)
		}
		stats[name] = c
	}
	return stats
}

// buildExporter builds cmd/backstop-exporter into a temporary directory.
func buildExporter(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "backstop-exporter")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/backstop-dev/backstop/cmd/backstop-exporter").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type runningExporter struct {
	url string
	cmd *exec.Cmd
}

// startExporter runs the binary over the queues (through --queues.config)
// until the benchmark ends.
func startExporter(b *testing.B, bin, redisAddr string, qs []exporter.Queue) *runningExporter {
	b.Helper()
	var cfg strings.Builder
	cfg.WriteString("queues:\n")
	for _, q := range qs {
		fmt.Fprintf(&cfg, "  - {name: %q, keys: {jobs: %q, delayed: %q, dlq: %q, stats: %q}}\n", q.Name, q.Keys.Jobs, q.Keys.Delayed, q.Keys.DLQ, q.Keys.Stats)
	}
	path := filepath.Join(b.TempDir(), "queues.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return runExporter(b, bin, "--redis.addr="+redisAddr, "--queues.config="+path)
}

// runExporter runs the exporter binary with args on a free loopback port
// until the benchmark ends, and waits for it to be ready.
func runExporter(b *testing.B, bin string, args ...string) *runningExporter {
	b.Helper()
	return runServer(b, bin, "/-/ready", append(args, "--log.level=warn")...)
}

// runServer runs an exporter binary that takes --web.listen-address with
// args on a free loopback port until the benchmark ends, and waits until
// readyPath answers.
func runServer(b *testing.B, bin, readyPath string, args ...string) *runningExporter {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, append(args, "--web.listen-address="+addr)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	e := &runningExporter{url: "http://" + addr + "/metrics", cmd: cmd}
	eventually.True(b, 10*time.Second, "the exporter to be ready", func() bool {
		resp, err := http.Get("http://" + addr + readyPath)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return e
}

// collectSeconds scrapes once more and returns backstop_scrape_duration_seconds.
func (e *runningExporter) collectSeconds(b *testing.B) float64 {
	resp, err := http.Get(e.url) // the transport asks for gzip and decompresses
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "backstop_scrape_duration_seconds "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	b.Fatal("no backstop_scrape_duration_seconds")
	return 0
}

// cpuTime returns the CPU time the exporter process has used (user and
// system, /proc/PID/stat).
func (e *runningExporter) cpuTime(b *testing.B) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", e.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	// utime and stime are fields 14 and 15, counted after the ")" that
	// ends the command name (which may hold spaces).
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ, 100 on Linux
}

// peakRSS returns the exporter's peak resident set size (VmHWM).
func (e *runningExporter) peakRSS(b *testing.B) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc status")
	return 0
}
