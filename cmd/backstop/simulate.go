package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/backstop-dev/backstop/internal/plot"
	"github.com/backstop-dev/backstop/internal/simulate"
	"github.com/backstop-dev/backstop/policy"
)

// simulateCmd runs the thundering-herd simulation, or with "contention"
// the jitter comparison, and prints what happened.
func simulateCmd(args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "contention" {
		return simulateContention(args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "layers" {
		return simulateLayers(args[1:], stdout)
	}
	fs := newFlagSet("simulate")
	pol := fs.String("policy", "default", "policy file (JSON or YAML) or preset name")
	clients := fs.Int("clients", 1000, fmt.Sprintf("clients that fail at the same moment (1..%d)", simulate.MaxClients))
	processes := fs.Int("processes", 0, "policy instances the clients are spread over, at most one per client; one process's clients share its budget and breaker (default: one per 100 clients)")
	capacity := fs.Int("capacity", 200, fmt.Sprintf("calls per second the dependency serves once it has recovered (1..%d)", simulate.MaxCapacity))
	recovery := fs.Duration("recovery", 5*time.Second, "how long the dependency stays down")
	bucket := fs.Duration("bucket", 0, fmt.Sprintf("width of the herd's time buckets, at least 1ms and wide enough for at most %d buckets (default: a round width giving about 60)", simulate.MaxBuckets))
	seed := fs.Uint64("seed", 1, "PRNG seed: the same seed gives the same run")
	csvPath := fs.String("csv", "", "write the calls per bucket to this CSV file")
	out := fs.String("out", "", "write a chart: FILE.svg or FILE.png")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	// The simulation allocates per client and the table a row per bucket:
	// bound both before anything runs (simulate checks the same bounds).
	switch {
	case *clients < 1 || *clients > simulate.MaxClients:
		return fmt.Errorf("--clients: must be in 1..%d (got %d)", simulate.MaxClients, *clients)
	case *processes < 0 || *processes > *clients:
		return fmt.Errorf("--processes: must be in 0..%d, the clients (got %d)", *clients, *processes)
	case *capacity < 1 || *capacity > simulate.MaxCapacity:
		return fmt.Errorf("--capacity: must be in 1..%d (got %d)", simulate.MaxCapacity, *capacity)
	case *recovery < 0:
		return fmt.Errorf("--recovery: must be >= 0 (got %s)", *recovery)
	case *bucket != 0 && *bucket < time.Millisecond:
		return fmt.Errorf("--bucket: must be at least 1ms (got %s)", *bucket)
	}
	if err := checkChartPath(*out); err != nil {
		return err
	}
	p, _, src, err := loadPolicy(*pol)
	if err != nil {
		return err
	}
	res, err := simulate.Herd(src, *clients, simulate.WithProcesses(*processes), simulate.WithCapacity(*capacity),
		simulate.WithRecovery(*recovery), simulate.WithSeed(*seed))
	if err != nil {
		return err
	}
	width := bucket.Milliseconds()
	if width == 0 {
		width = simulate.AutoBucket(res.EndMs)
	} else if n := res.EndMs/width + 1; n > simulate.MaxBuckets {
		// How long the run is shows only now: a policy's delays can make
		// it last for years, and 1ms buckets of those are out of reach.
		return fmt.Errorf("--bucket: %s cuts this run of %s into %d buckets, more than %d: use --bucket %s or more",
			dur(width), dur(res.EndMs), n, simulate.MaxBuckets, dur(res.EndMs/simulate.MaxBuckets+1))
	}
	buckets := res.Buckets(width)
	writeHerd(stdout, *pol, p, res, buckets, width, *seed)
	if *csvPath != "" {
		if err := writeHerdCSV(*csvPath, buckets); err != nil {
			return err
		}
	}
	if *out != "" {
		if err := writeChart(*out, func(w io.Writer, format string) error {
			return plot.Herd(w, format, res, width)
		}); err != nil {
			return err
		}
	}
	return nil
}

func writeHerd(w io.Writer, arg string, p *policy.Policy, r *simulate.HerdResult, buckets []simulate.Bucket, width int64, seed uint64) {
	procs := "processes"
	if r.Processes == 1 {
		procs = "process"
	}
	fmt.Fprintf(w, "%d clients in %d %s fail at once and retry with %s\n", r.Clients, r.Processes, procs, arg)
	fmt.Fprintf(w, "the dependency is down for %s, then serves %d calls/s; seed %d\n\n", dur(r.RecoveryMs), r.CapacityPerSec, seed)
	var peak, peakRetries simulate.Bucket
	for _, b := range buckets {
		if b.Calls > peak.Calls {
			peak = b
		}
		if b.Retries > peakRetries.Retries {
			peakRetries = b
		}
	}
	gaveUp, reasons := 0, make([]string, 0, len(r.GaveUp))
	refused := map[policy.Reason]int{}
	for _, g := range r.GaveUp {
		gaveUp += g.Clients
		reasons = append(reasons, fmt.Sprintf("%s %d", g.Reason, g.Clients))
		refused[g.Reason] = g.Clients
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "calls\t%d (%d first attempts, %d retries); %d shed for capacity\n", r.Calls, r.Calls-r.Retries, r.Retries, r.Shed)
	fmt.Fprintf(tw, "succeeded\t%d clients", r.Succeeded())
	if r.Succeeded() > 0 {
		fmt.Fprintf(tw, "; completion p50 %s, p99 %s, max %s", dur(r.Percentile(0.5)), dur(r.Percentile(0.99)), dur(r.CompletionMs[len(r.CompletionMs)-1]))
	}
	fmt.Fprintf(tw, "\ngave up\t%d clients", gaveUp)
	if gaveUp > 0 {
		fmt.Fprintf(tw, ": %s", strings.Join(reasons, ", "))
	}
	if p.Stateful() {
		fmt.Fprintf(tw, "\nbudget, breaker\t%d retries refused by the budget, %d by an open breaker; breakers opened %d times\n",
			refused[policy.BudgetExhausted], refused[policy.CircuitOpen], r.BreakerTrips)
	} else {
		fmt.Fprintf(tw, "\nbudget, breaker\tnone in this policy\n")
	}
	fmt.Fprintf(tw, "herd peak\t%d calls in the %s from %s; retries: %d in the %s from %s\n",
		peak.Calls, dur(width), dur(peak.StartMs), peakRetries.Retries, dur(width), dur(peakRetries.StartMs))
	fmt.Fprintf(tw, "finished\tat %s\n", dur(r.EndMs))
	tw.Flush()

	fmt.Fprintf(w, "\ncalls per %s (the herd: █ served, ░ failed)\n", dur(width))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "from\tcalls\tretries\tserved\t")
	for _, b := range buckets {
		ok, all := barCols(b.OK, peak.Calls), barCols(b.Calls, peak.Calls)
		bar := strings.Repeat("█", ok) + strings.Repeat("░", all-ok)
		if bar != "" {
			bar = "  " + bar
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", dur(b.StartMs), b.Calls, b.Retries, b.OK, bar)
	}
	tw.Flush()
}

// barCols scales n against top to at most 40 columns; a non-zero count
// stays visible.
func barCols(n, top int) int {
	if n == 0 || top == 0 {
		return 0
	}
	return max(1, n*40/top)
}

func writeHerdCSV(path string, buckets []simulate.Bucket) error {
	return writeCSV(path, []string{"start_ms", "calls", "retries", "served", "failed"}, func(row func(...any)) {
		for _, b := range buckets {
			row(b.StartMs, b.Calls, b.Retries, b.OK, b.Calls-b.OK)
		}
	})
}

// writeCSV writes a header and the rows that rows emits to path.
func writeCSV(path string, header []string, rows func(row func(...any))) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	cw.Write(header)
	rows(func(vs ...any) {
		rec := make([]string, len(vs))
		for i, v := range vs {
			if f, ok := v.(float64); ok {
				rec[i] = strconv.FormatFloat(f, 'f', 3, 64) // means: no float noise in the file
			} else {
				rec[i] = fmt.Sprint(v)
			}
		}
		cw.Write(rec)
	})
	cw.Flush()
	return errors.Join(cw.Error(), f.Close())
}

// maxContentionPoints bounds simulate contention's --clients list: more
// points than a chart or a table shows.
const maxContentionPoints = 100

// simulateContention runs the contention experiment for each policy and
// number of clients, and prints the work and completion-time tables.
func simulateContention(args []string, stdout io.Writer) error {
	fs := newFlagSet("simulate contention")
	clientsFlag := fs.String("clients", "10,15,20,25,30,35,40,45,50", fmt.Sprintf("numbers of clients to compare, comma-separated: at most %d numbers, each in 1..%d", maxContentionPoints, simulate.MaxClients))
	pols := fs.String("policy", "", fmt.Sprintf("policies to compare, FILE|PRESET,..., at most %d (default: exponential backoff with no, full, equal and decorrelated jitter)", maxPlotPolicies))
	runs := fs.Int("runs", 100, fmt.Sprintf("runs averaged per point (1..%d)", simulate.MaxRuns))
	seed := fs.Uint64("seed", 1, "PRNG seed: the same seed gives the same results")
	csvPath := fs.String("csv", "", "write the results to this CSV file")
	out := fs.String("out", "", "write a chart: FILE.svg or FILE.png")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *runs < 1 || *runs > simulate.MaxRuns {
		return fmt.Errorf("--runs: must be in 1..%d (got %d)", simulate.MaxRuns, *runs)
	}
	if err := checkChartPath(*out); err != nil {
		return err
	}
	// Every number of clients is a point simulated for every policy, each
	// allocating per client: bound the lists and the numbers.
	list := splitList(*clientsFlag)
	if len(list) > maxContentionPoints {
		return fmt.Errorf("--clients: at most %d numbers (got %d)", maxContentionPoints, len(list))
	}
	var counts []int
	for _, s := range list {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("--clients: %q is not a number of clients", s)
		}
		if n > simulate.MaxClients {
			return fmt.Errorf("--clients: each must be in 1..%d (got %d)", simulate.MaxClients, n)
		}
		counts = append(counts, n)
	}
	if len(counts) == 0 {
		return fmt.Errorf("%w: --clients: no number of clients given", errUsage)
	}
	srcs := simulate.JitterPolicies()
	var names []string // as the command line names them; nil: the policies' own names
	if *pols != "" {
		if n := len(splitList(*pols)); n > maxPlotPolicies {
			return fmt.Errorf("--policy: at most %d policies (got %d)", maxPlotPolicies, n)
		}
		srcs = nil
		for _, arg := range splitList(*pols) {
			_, name, src, err := loadPolicy(arg)
			if err != nil {
				return err
			}
			srcs, names = append(srcs, src), append(names, name)
		}
	}
	series := make([][]simulate.ContentionResult, len(srcs))
	for i, src := range srcs {
		for _, n := range counts {
			r, err := simulate.Contention(src, n, simulate.WithRuns(*runs), simulate.WithSeed(*seed))
			if err != nil {
				return err
			}
			if names != nil {
				r.Policy = names[i]
			}
			series[i] = append(series[i], r)
		}
	}
	if len(series) == 0 {
		return fmt.Errorf("%w: --policy: no policy given", errUsage)
	}
	fmt.Fprintf(stdout, "clients race to update one row (optimistic concurrency); mean of %d runs per point, network 10ms ± 2ms, seed %d\n", *runs, *seed)
	writeContentionTable(stdout, "\ntotal work: writes per run", series, func(r simulate.ContentionResult) string {
		return strconv.FormatFloat(r.Calls, 'f', 1, 64)
	})
	writeContentionTable(stdout, "\ncompletion time: until the last client's write lands", series, func(r simulate.ContentionResult) string {
		return dur(int64(math.Round(r.CompletionMs)))
	})
	if *csvPath != "" {
		err := writeCSV(*csvPath, []string{"policy", "clients", "runs", "calls", "completion_ms", "gave_up"}, func(row func(...any)) {
			for _, rs := range series {
				for _, r := range rs {
					row(r.Policy, r.Clients, r.Runs, r.Calls, r.CompletionMs, r.GaveUp)
				}
			}
		})
		if err != nil {
			return err
		}
	}
	if *out != "" {
		if err := writeChart(*out, func(w io.Writer, format string) error {
			return plot.Contention(w, format, series...)
		}); err != nil {
			return err
		}
	}
	return nil
}

// writeContentionTable prints one value per number of clients (rows) and
// policy (columns).
func writeContentionTable(w io.Writer, title string, series [][]simulate.ContentionResult, cell func(simulate.ContentionResult) string) {
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "clients\t")
	for _, rs := range series {
		fmt.Fprintf(tw, "%s\t", rs[0].Policy)
	}
	fmt.Fprintln(tw)
	for j := range series[0] {
		fmt.Fprintf(tw, "%d\t", series[0][j].Clients)
		for _, rs := range series {
			fmt.Fprintf(tw, "%s\t", cell(rs[j]))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// simulateLayers prints, for 1 to --layers layers, the calls one request
// makes to a service that is down when every layer retries, and when a
// layer gives up what a layer below already retried.
func simulateLayers(args []string, stdout io.Writer) error {
	fs := newFlagSet("simulate layers")
	pol := fs.String("policy", "default", "the policy every layer retries with: a file (JSON or YAML) or a preset name")
	layers := fs.Int("layers", 3, fmt.Sprintf("the most layers of retry loops to compare (1..%d)", simulate.MaxLayers))
	recovery := fs.Duration("recovery", time.Hour, "how long the bottom service stays down (it answers 503, then 200)")
	seed := fs.Uint64("seed", 1, "PRNG seed for the jitter: the same seed gives the same run")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *layers < 1 || *layers > simulate.MaxLayers:
		return fmt.Errorf("--layers: must be in 1..%d (got %d)", simulate.MaxLayers, *layers)
	case *recovery < 0:
		return fmt.Errorf("--recovery: must be >= 0 (got %s)", *recovery)
	}
	_, _, src, err := loadPolicy(*pol)
	if err != nil {
		return err
	}
	rows, err := simulate.Layers(src, *layers, simulate.WithRecovery(*recovery), simulate.WithSeed(*seed))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "one request through 1 to %d layers that each retry with %s; the bottom service is down for %s; seed %d\n\n",
		*layers, *pol, dur(recovery.Milliseconds()), *seed)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "layers\tevery layer retries\tretry at one layer")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", r.Layers, layerOutcome(r.Without), layerOutcome(r.With))
	}
	return tw.Flush()
}

// layerOutcome says what one run cost the bottom and how the top ended.
func layerOutcome(r simulate.LayerRun) string {
	end := "succeeded"
	if !r.Succeeded {
		end = r.Reason.String()
	}
	return fmt.Sprintf("%d calls, %s at %s", r.BottomCalls, end, dur(r.EndMs))
}
