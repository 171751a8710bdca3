package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// command is what `backstop CMD -h` prints besides the flags.
type command struct {
	synopsis string // after "usage: backstop "
	desc     string
	example  string
	noFlags  bool   // positional arguments only: -h is never passed to it
	notes    string // printed after the flags
}

// commands are the commands with subcommand words as keys. A command
// missing here still answers -h with its flags (see printHelp).
var commands = map[string]command{
	"policy check": {synopsis: "policy check [--chart] [--rows N] [--strict] FILE|PRESET",
		desc:    "Validate a policy file (JSON or YAML) or a preset, print its retry schedule, and warn on stderr of each lint (an anti-pattern of the retry guidance: docs/policy.md, \"Lints\"). --strict exits 1 when a lint fires.",
		example: "backstop policy check --strict policy.yaml"},
	"policy presets": {synopsis: "policy presets", noFlags: true,
		desc:    "List the named presets, one line each.",
		example: "backstop policy presets"},
	"policy show": {synopsis: "policy show PRESET", noFlags: true,
		desc:    "Print a preset's policy file, to start your own from.",
		example: "backstop policy show critical > my-policy.json"},
	"policy plot": {synopsis: "policy plot FILE|PRESET --out FILE.svg|.png [--compare FILE|PRESET,...]",
		desc:    "Chart a policy's schedule: the jitter envelope and the knees.",
		example: "backstop policy plot critical --out critical.svg --compare batch"},
	"policy import": {synopsis: "policy import [--from cloud-tasks|spring] FILE|-",
		desc:    "Turn a Cloud Tasks RetryConfig or Spring Retry properties into a backstop policy file.",
		example: "backstop policy import --from cloud-tasks retry.yaml > policy.json"},
	"simulate": {synopsis: "simulate [flags]",
		desc:    "Simulate the herd N clients send a dependency that recovers, under a policy.",
		example: "backstop simulate --policy critical --clients 1000 --recovery 5s"},
	"simulate contention": {synopsis: "simulate contention [flags]",
		desc:    "Compare jitter modes by the work and time clients contending for one resource take (docs/simulation.md).",
		example: "backstop simulate contention --clients 10,20,50 --runs 10"},
	"simulate layers": {synopsis: "simulate layers [flags]",
		desc:    "One request through 1 to N layers that each retry, to a service that is down: the calls it gets with and without retry at one layer (docs/layers.md).",
		example: "backstop simulate layers --policy default --layers 4"},
	"decide": {synopsis: "decide --policy FILE|PRESET [--random draw|X]",
		desc:    "Read failures as JSON lines on stdin and write the policy's decisions as JSON lines, through backstop.wasm. A line without random gets a uniform draw in [0, 1) (jitter scales the delay by it); pass random (or --random X for every line without one) to make an answer reproducible.",
		example: `echo '{"attempt":1,"http_status":503}' | backstop decide --policy critical`},
	"demo": {synopsis: "demo [flags]",
		desc:    "The whole system moving: queues, workers deciding through backstop.wasm, the exporter and a live view, until Ctrl-C. --broker rabbitmq runs it on a rabbitmq-server it starts.",
		example: "backstop demo --duration 2m", notes: demoEmbeddedHelp},
	"queue stats": {synopsis: "queue stats --queue Q [flags]",
		desc:    "Print a queue's sizes (jobs, pending, delayed, dead letters) and its counters; with --amqp.url, a RabbitMQ queue's ready, unacked and consumers, its dead letters and the delay levels.",
		example: "backstop queue stats --redis.url redis://127.0.0.1:6379/0 --queue payments"},
	"queue enqueue": {synopsis: "queue enqueue --queue Q --id ID [--payload P] [--type T]",
		desc:    "Add a job to a queue's jobs stream, of a job type or untyped; with --amqp.url, to the RabbitMQ queue.",
		example: "backstop queue enqueue --queue payments --id order-42 --payload '{\"sku\":7}' --type charge_card"},
	"queue types": {synopsis: "queue types --queue Q [--limit N]",
		desc:    "Show the job types a queue counts by name and their figures; --limit sets how many it may (the others count as other). Redis only: RabbitMQ's workers export them as metrics.",
		example: "backstop queue types --queue payments --limit 100"},
	"queue run": {synopsis: "queue run --queue Q --id ID | --all-due-before T --limit N",
		desc:    "Move delayed jobs to the jobs stream now, before they are due (Cloud Tasks' RunTask), attempt count kept; with --amqp.url, from RabbitMQ's delay levels and the workers' movers to the queue.",
		example: "backstop queue run --queue payments --all-due-before now --limit 100"},
	"dlq inspect": {synopsis: "dlq inspect --queue Q [flags]",
		desc:    "Count a queue's dead letters by reason and show the newest ones.",
		example: "backstop dlq inspect --queue payments --newest 20"},
	"dlq replay": {synopsis: "dlq replay --queue Q --limit N | --id ID [--reason R] [--type T] [--keep-attempts] [--rate N/s]",
		desc:    "Move dead letters back to the queue's jobs stream, in bounded batches, the attempt count reset unless --keep-attempts; --id: one job's; --rate: paced. With --amqp.url, to the original RabbitMQ queue only.",
		example: "backstop dlq replay --queue payments --limit 100 --reason max_attempts_reached --rate 50/s"},
	"dlq delete": {synopsis: "dlq delete --queue Q --id ID --reason TEXT",
		desc:    "Discard a job's dead letters for good, each recorded first, with the reason, who and when, in the audit stream {Q}:audit (with --amqp.url, the queue Q.audit) and counted (discarded).",
		example: "backstop dlq delete --queue payments --id order-42 --reason duplicate-charge"},
	"dlq purge": {synopsis: "dlq purge --queue Q --reason TEXT [--dead-letter-reason R] [--type T] [--limit N]",
		desc:    "Discard dead letters for good (those with a reason, of a type, at most N), each recorded first in the audit stream {Q}:audit (with --amqp.url, the queue Q.audit) and counted (discarded).",
		example: "backstop dlq purge --queue payments --reason incident-1234 --dead-letter-reason malformed --limit 1000"},
	"console": {synopsis: "console --queue Q [--queue Q2] [--writable] [--web.config.file FILE] [--prometheus.url URL | --sample.interval D] [--policy FILE|PRESET]",
		desc:    "Serve the web console of dead letters: an overview of the queues, a paged and filtered list of each DLQ, one dead letter, and with --writable replay, delete, purge and force run, each discard recorded in the audit with the signed-in user. Read-only by default; TLS and basic auth from --web.config.file (exporter-toolkit). The overview's last-hour retry rate and DLQ ingestion come from --prometheus.url, else from the console's own samples of the exporter's readers every --sample.interval (on RabbitMQ through --rabbitmq.management-url), with since when it has them.",
		example: "backstop console --queue payments --queue emails --web.config.file web.yml --writable"},
	"rules generate": {synopsis: "rules generate [--config FILE] [--out DIR]",
		desc:    "Write the Prometheus recording and alerting rule files.",
		example: "backstop rules generate --config rules/config.yaml --out rules"},
	"dashboards generate": {synopsis: "dashboards generate [--out DIR]",
		desc:    "Write the Grafana dashboards' JSON.",
		example: "backstop dashboards generate --out dashboards"},
	"version": {synopsis: "version", noFlags: true,
		desc:    "Print the version.",
		example: "backstop version"},
}

// flagSets holds the last flag set each command built, by name, so that
// printHelp can list any command's flags without the command printing them.
var flagSets sync.Map

// newFlagSet is the flag set every command parses its arguments with. It
// prints nothing, on -h (run answers -h with printHelp before the command
// runs) or on an error (parseFlags returns it, main prints it).
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {}
	fs.SetOutput(io.Discard) // parseFlags names the problem, with the command's usage
	flagSets.Store(name, fs)
	return fs
}

func isHelpFlag(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// helpRequest reports the command whose help args ask for: "-h" (or -help,
// --help) anywhere after the command's words.
func helpRequest(args []string) (string, bool) {
	if len(args) < 2 {
		return "", false
	}
	key, rest := args[0], args[1:]
	if _, ok := commands[args[0]+" "+args[1]]; ok || !strings.HasPrefix(args[1], "-") {
		key, rest = args[0]+" "+args[1], args[2:]
	}
	for _, a := range rest {
		if a == "--" {
			break
		}
		if isHelpFlag(a) {
			return key, true
		}
	}
	return "", false
}

// printHelp prints a command's synopsis, description, flags and example.
// The flags come from the command itself, run with just -h: it stops at
// parsing them, before it reads or writes anything.
func printHelp(ctx context.Context, key string, stdin io.Reader, stdout io.Writer) error {
	c, known := commands[key]
	var fs *flag.FlagSet
	if !c.noFlags {
		flagSets.Delete(key)
		dispatch(ctx, append(strings.Fields(key), "-h"), stdin, io.Discard, io.Discard)
		if v, ok := flagSets.Load(key); ok {
			fs = v.(*flag.FlagSet)
		}
	}
	if !known && fs == nil {
		for k := range commands {
			if strings.HasPrefix(k, key+" ") { // a group: "backstop policy -h"
				_, err := io.WriteString(stdout, usage)
				return err
			}
		}
		return fmt.Errorf("%w: unknown command %q", errUsage, key)
	}
	synopsis := c.synopsis
	if synopsis == "" {
		synopsis = key + " [flags]"
	}
	fmt.Fprintf(stdout, "usage: backstop %s\n", synopsis)
	if c.desc != "" {
		fmt.Fprintf(stdout, "\n%s\n", c.desc)
	}
	if fs != nil {
		fmt.Fprintln(stdout, "\nflags:")
		printFlags(stdout, fs)
	}
	if c.notes != "" {
		io.WriteString(stdout, c.notes)
	}
	if c.example != "" {
		fmt.Fprintf(stdout, "\nexample:\n  %s\n", c.example)
	}
	return nil
}

// parseFlags parses a command's arguments, flags before or after the
// positional ones, and checks that the positional arguments are as many as
// names (their names in the synopsis, "FILE|PRESET", for the error). Its
// errors are usage errors that name the problem: the unknown flag and the
// flag it is likely a typo of, the value a flag refused and why.
func parseFlags(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, flagError(fs, err)
	}
	switch {
	case len(pos) < len(names):
		return nil, fmt.Errorf("%w: missing %s", errUsage, names[len(pos)])
	case len(pos) > len(names):
		return nil, fmt.Errorf("%w: unexpected argument %q", errUsage, pos[len(names)])
	}
	return pos, nil
}

// invalidValue matches the flag package's `invalid value "5" for flag
// -duration: parse error`.
var invalidValue = regexp.MustCompile(`^invalid value "(.*)" for flag -([^:]+): (.*)$`)

// flagError turns an error of the flag package into a usage error a user
// can act on: flags are written --name, as the help shows them.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		msg = "unknown flag --" + name
		if s := closest(name, names); s != "" {
			msg += fmt.Sprintf(" (did you mean --%s?)", s)
		}
	} else if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		msg = fmt.Sprintf("--%s needs a value", name)
	} else if m := invalidValue.FindStringSubmatch(msg); m != nil {
		value, name, why := m[1], m[2], m[3]
		msg = fmt.Sprintf("--%s %s: %s", name, value, why)
		if g, ok := fs.Lookup(name).Value.(flag.Getter); ok {
			if _, isDuration := g.Get().(time.Duration); isDuration {
				msg = fmt.Sprintf("--%s %s: not a duration, e.g. 500ms, 5s, 2m or 1h30m", name, value)
				if _, err := strconv.ParseFloat(value, 64); err == nil {
					msg = fmt.Sprintf("--%s %s: missing unit, e.g. %ss", name, value, value)
				}
			}
		}
	}
	return fmt.Errorf("%w: %s", errUsage, msg)
}

// closest returns the candidate within two edits of word (and shorter
// than word by edits), the nearest first, or "" when none is.
func closest(word string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(word, c); d < bestD && d < len(word) || d == bestD && c < best {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, a
// transposition of neighbours counting as one edit (chek, chekc: check).
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// commandKey is the command args name, "policy check" or "decide", and
// whether it is one.
func commandKey(args []string) (string, bool) {
	if len(args) >= 2 {
		if _, ok := commands[args[0]+" "+args[1]]; ok {
			return args[0] + " " + args[1], true
		}
	}
	if len(args) >= 1 {
		if _, ok := commands[args[0]]; ok {
			return args[0], true
		}
	}
	return "", false
}

// groupCommands returns the commands of a group ("policy": "policy
// check", "policy plot", ...), sorted.
func groupCommands(group string) []string {
	var keys []string
	for k := range commands {
		if strings.HasPrefix(k, group+" ") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// unknownCommand is the usage error for args that name no command, with
// the command it is likely a typo of.
func unknownCommand(args []string) error {
	if groupCommands(args[0]) != nil {
		if len(args) < 2 {
			return fmt.Errorf("%w: %s needs a command", errUsage, args[0])
		}
		var subs []string
		for _, k := range groupCommands(args[0]) {
			subs = append(subs, strings.TrimPrefix(k, args[0]+" "))
		}
		if s := closest(args[1], subs); s != "" {
			return fmt.Errorf("%w: unknown command %q (did you mean %q?)", errUsage, args[0]+" "+args[1], args[0]+" "+s)
		}
		return fmt.Errorf("%w: unknown command %q", errUsage, args[0]+" "+args[1])
	}
	seen := map[string]bool{"help": true}
	tops := []string{"help"}
	for k := range commands {
		if w := strings.Fields(k)[0]; !seen[w] {
			seen[w] = true
			tops = append(tops, w)
		}
	}
	sort.Strings(tops)
	if s := closest(args[0], tops); s != "" {
		return fmt.Errorf("%w: unknown command %q (did you mean %q?)", errUsage, args[0], s)
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
}

// usageMessage is what a usage error prints on stderr: the problem, then
// the usage of the command args name (its synopsis
// and flags; -h adds the description and an example), or of the group, not
// the whole usage, which only a bare "backstop" gets.
// The shape is the go command's: the error, "usage: ...", "Run ... for".
func usageMessage(args []string, err error) string {
	if len(args) == 0 && err == errUsage {
		return usage
	}
	var b strings.Builder
	if msg := strings.TrimPrefix(err.Error(), errUsage.Error()+": "); err != errUsage {
		fmt.Fprintf(&b, "backstop: %s\n", msg)
	}
	key, ok := commandKey(args)
	switch {
	case ok:
		synopsis := commands[key].synopsis
		if synopsis == "" {
			synopsis = key + " [flags]"
		}
		fmt.Fprintf(&b, "usage: backstop %s\n", synopsis)
		if v, ok := flagSets.Load(key); ok {
			fs := v.(*flag.FlagSet)
			b.WriteString("\nflags:\n")
			printFlags(&b, fs)
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "Run \"backstop %s -h\" for a description and an example.\n", key)
	case len(args) > 0 && groupCommands(args[0]) != nil:
		for i, k := range groupCommands(args[0]) {
			lead := "usage: "
			if i > 0 {
				lead = "       "
			}
			synopsis := commands[k].synopsis
			if synopsis == "" {
				synopsis = k + " [flags]"
			}
			fmt.Fprintf(&b, "%sbackstop %s\n", lead, synopsis)
		}
		fmt.Fprintf(&b, "Run \"backstop %s COMMAND -h\" for a command's flags and an example.\n", args[0])
	default:
		b.WriteString("Run \"backstop help\" for the commands.\n")
	}
	return b.String()
}

// deprecations is where a flag's old name says it is deprecated: the
// command's stderr (run sets it).
var deprecations io.Writer = os.Stderr

// renamed registers old, a flag's name before issue 42, as an alias of the
// flag now named name: it sets the same value and prints "--old is
// deprecated: use --name". The CLI's URL flags are dotted now
// (--redis.url, --amqp.url), as backstop-exporter's are, and their
// environment variables (BACKSTOP_REDIS_URL) are the same in both. The
// help leaves the old names out (printFlags).
func renamed(fs *flag.FlagSet, old, name string) {
	fs.Var(&renamedFlag{Value: fs.Lookup(name).Value, old: old, name: name}, old, "deprecated: --"+name)
}

type renamedFlag struct {
	flag.Value
	old, name string
	warned    bool // a command may parse its arguments twice: one line
}

func (r *renamedFlag) Set(s string) error {
	if !r.warned {
		fmt.Fprintf(deprecations, "backstop: --%s is deprecated: use --%s\n", r.old, r.name)
		r.warned = true
	}
	return r.Value.Set(s)
}

func (r *renamedFlag) String() string {
	if r == nil || r.Value == nil { // the flag package's zero value, for PrintDefaults
		return ""
	}
	return r.Value.String()
}

// flagName is a flag's current name, the one an old name stands for.
func flagName(fl *flag.Flag) string {
	if r, ok := fl.Value.(*renamedFlag); ok {
		return r.name
	}
	return fl.Name
}

// printFlags prints fs's flags as PrintDefaults does, without the old
// names of renamed flags.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	skip := false
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if strings.HasPrefix(line, "  -") {
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "  -"), " ")
			fl := fs.Lookup(strings.TrimSpace(name))
			_, skip = fl.Value.(*renamedFlag)
		}
		if !skip {
			io.WriteString(w, line)
		}
	}
}
