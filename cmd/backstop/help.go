package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
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
	"policy check": {synopsis: "policy check [--chart] [--rows N] FILE|PRESET",
		desc:    "Validate a policy file (JSON or YAML) or a preset and print its retry schedule.",
		example: "backstop policy check --chart critical"},
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
		desc:    "Print a queue's sizes (jobs, pending, delayed, dead letters) and its counters; with --amqp-url, a RabbitMQ queue's ready, unacked and consumers, its dead letters and the delay levels.",
		example: "backstop queue stats --redis-url redis://127.0.0.1:6379/0 --queue payments"},
	"queue enqueue": {synopsis: "queue enqueue --queue Q --id ID [--payload P] [--type T]",
		desc:    "Add a job to a queue's jobs stream, of a job type or untyped.",
		example: "backstop queue enqueue --queue payments --id order-42 --payload '{\"sku\":7}' --type charge_card"},
	"queue types": {synopsis: "queue types --queue Q [--limit N]",
		desc:    "Show the job types a queue counts by name and their figures; --limit sets how many it may (the others count as other).",
		example: "backstop queue types --queue payments --limit 100"},
	"queue run": {synopsis: "queue run --queue Q --id ID | --all-due-before T --limit N",
		desc:    "Move delayed jobs to the jobs stream now, before they are due (Cloud Tasks' RunTask).",
		example: "backstop queue run --queue payments --all-due-before now --limit 100"},
	"dlq inspect": {synopsis: "dlq inspect --queue Q [flags]",
		desc:    "Count a queue's dead letters by reason and show the newest ones.",
		example: "backstop dlq inspect --queue payments --newest 20"},
	"dlq replay": {synopsis: "dlq replay --queue Q --limit N | --id ID [--reason R] [--type T] [--keep-attempts] [--rate N/s]",
		desc:    "Move dead letters back to the queue's jobs stream, in bounded batches, the attempt count reset unless --keep-attempts; --id: one job's; --rate: paced. With --amqp-url, to the original RabbitMQ queue only.",
		example: "backstop dlq replay --queue payments --limit 100 --reason max_attempts_reached --rate 50/s"},
	"dlq delete": {synopsis: "dlq delete --queue Q --id ID --reason TEXT",
		desc:    "Discard a job's dead letters for good, each recorded first, with the reason, who and when, in the audit stream {Q}:audit (with --amqp-url, the queue Q.audit) and counted (discarded).",
		example: "backstop dlq delete --queue payments --id order-42 --reason duplicate-charge"},
	"dlq purge": {synopsis: "dlq purge --queue Q --reason TEXT [--dead-letter-reason R] [--type T] [--limit N]",
		desc:    "Discard dead letters for good (those with a reason, of a type, at most N), each recorded first in the audit stream {Q}:audit (with --amqp-url, the queue Q.audit) and counted (discarded).",
		example: "backstop dlq purge --queue payments --reason incident-1234 --dead-letter-reason malformed --limit 1000"},
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
// prints nothing on -h (run answers -h with printHelp before the command
// runs); a bad flag is still named on stderr.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {}
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
		fs.SetOutput(stdout)
		fs.PrintDefaults()
	}
	if c.notes != "" {
		io.WriteString(stdout, c.notes)
	}
	if c.example != "" {
		fmt.Fprintf(stdout, "\nexample:\n  %s\n", c.example)
	}
	return nil
}
