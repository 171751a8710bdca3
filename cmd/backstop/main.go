// Command backstop checks retry policies and asks them for decisions.
//
//	backstop policy check FILE|PRESET   validate, print the schedule and the lints
//	backstop policy presets             list the presets
//	backstop policy show PRESET         print a preset's policy file
//	backstop policy import FILE         a Cloud Tasks or Spring Retry config as a policy
//	backstop decide --policy FILE|PRESET
//	                                    JSON lines in, decisions out, through backstop.wasm
//	backstop demo                      queues, workers, exporter and a live view
//	backstop queue stats --queue Q     sizes and counters of a queue
//	backstop queue enqueue --queue Q --id ID [--type T]
//	backstop queue types --queue Q [--limit N]
//	backstop queue run --queue Q --id ID | --all-due-before T --limit N
//	                                    run delayed jobs now
//	backstop dlq inspect --queue Q     dead letters by reason, the newest ones
//	backstop dlq replay --queue Q --limit N [--reason R] [--type T]
//	backstop dlq delete --queue Q --id ID --reason TEXT
//	backstop dlq purge --queue Q --reason TEXT [--dead-letter-reason R]
//	backstop console --queue Q [--writable] the web console of dead letters
//	backstop version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/backstop-dev/backstop/internal/buildinfo"
)

const usage = `usage: backstop <command> [arguments]

commands:
  policy check [--chart] [--strict] FILE|PRESET
                              validate a policy, print its retry schedule and
                              its lints (--strict: exit 1 when one fires)
  policy presets              list the named presets
  policy show PRESET          print a preset's policy file
  policy plot FILE|PRESET --out FILE.svg|.png [--compare FILE|PRESET,...]
                              chart the schedule: jitter envelope, knees
  policy import [--from cloud-tasks|spring] FILE|-
                              a Cloud Tasks RetryConfig or Spring Retry
                              properties as a backstop policy file
  simulate [--policy FILE|PRESET] [--clients N] [--capacity N] [--recovery D]
                              the herd N clients send a recovering dependency
  simulate contention         the jitter comparison (docs/simulation.md)
  simulate layers [--layers N] the calls N layers of retries make, with and
                              without retry at one layer (docs/layers.md)
  decide --policy FILE|PRESET read failures as JSON lines on stdin, write
                              decisions as JSON lines, through backstop.wasm
  demo                        the whole system moving: queues, workers deciding
                              through backstop.wasm, the exporter, a live view
  queue stats --queue Q       sizes and counters of a queue, per job type too
  queue enqueue --queue Q --id ID [--payload P] [--type T]
                              add a job, of a job type or untyped
  queue types --queue Q [--limit N]
                              the job types counted by name; set their limit
  queue run --queue Q --id ID | --all-due-before T --limit N
                              run delayed jobs now, before they are due
  dlq inspect --queue Q       dead letters by reason, and the newest ones
  dlq replay --queue Q --limit N [--reason R] [--type T]
                              move dead letters back to the jobs stream
                              (--id ID, --keep-attempts, --rate N/s)
  dlq delete --queue Q --id ID --reason TEXT
                              discard a job's dead letters, kept in the audit
  dlq purge --queue Q --reason TEXT [--dead-letter-reason R] [--type T]
                              discard dead letters, kept in the audit
  console --queue Q [--queue Q2] [--writable] [--web.config.file FILE]
                              the web console of dead letters (read-only
                              unless --writable)
  rules generate [--config FILE] [--out DIR]
                              write the Prometheus rule files
  dashboards generate [--out DIR]
                              write the Grafana dashboards
  version                     print the version

Queue commands take --redis.url (env BACKSTOP_REDIS_URL) or --redis.cluster,
--group and --json; stats and the dlq commands take --amqp.url (env
BACKSTOP_AMQP_URL) for RabbitMQ instead; "backstop COMMAND -h" lists the flags.
`

// version is set with -ldflags "-X main.version=..." (make build); a
// build without it (go install) takes its version from the build info.
var version = ""

// errUsage marks errors that should print the usage of the command (see
// usageMessage): "%w: what is wrong".
var errUsage = errors.New("usage")

func main() {
	// Ctrl-C, kill and a closed terminal end commands the same way: the demo
	// stops its workers, prints its summary and removes its Redis.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, usageMessage(os.Args[1:], err))
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "backstop:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	deprecations = stderr
	if key, ok := helpRequest(args); ok {
		return printHelp(ctx, key, stdin, stdout)
	}
	return dispatch(ctx, args, stdin, stdout, stderr)
}

// dispatch runs the command args name.
func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	switch args[0] {
	case "policy":
		if len(args) < 2 {
			break
		}
		switch args[1] {
		case "check":
			return policyCheck(args[2:], stdout, stderr)
		case "presets":
			return policyPresets(stdout)
		case "show":
			return policyShow(args[2:], stdout)
		case "plot":
			return policyPlot(args[2:], stdout)
		case "import":
			return policyImport(args[2:], stdin, stdout, stderr)
		}
	case "decide":
		return decide(ctx, args[1:], stdin, stdout)
	case "simulate":
		return simulateCmd(args[1:], stdout)
	case "rules":
		if len(args) >= 2 && args[1] == "generate" {
			return rulesGenerate(args[2:], stdout)
		}
	case "dashboards":
		if len(args) >= 2 && args[1] == "generate" {
			return dashboardsGenerate(args[2:], stdout)
		}
	case "demo":
		return demo(ctx, args[1:], stdout)
	case "queue":
		if len(args) >= 2 && args[1] == "stats" {
			return queueStats(ctx, args[2:], stdout, stderr)
		}
		if len(args) >= 2 && args[1] == "run" {
			return queueRun(ctx, args[2:], stdout)
		}
		if len(args) >= 2 && args[1] == "enqueue" {
			return queueEnqueue(ctx, args[2:], stdout)
		}
		if len(args) >= 2 && args[1] == "types" {
			return queueTypes(ctx, args[2:], stdout)
		}
	case "dlq":
		if len(args) >= 2 && args[1] == "inspect" {
			return dlqInspect(ctx, args[2:], stdout, stderr)
		}
		if len(args) >= 2 && args[1] == "replay" {
			return dlqReplay(ctx, args[2:], stdout, stderr)
		}
		if len(args) >= 2 && args[1] == "delete" {
			return dlqDelete(ctx, args[2:], stdout, stderr)
		}
		if len(args) >= 2 && args[1] == "purge" {
			return dlqPurge(ctx, args[2:], stdout, stderr)
		}
	case "console":
		return consoleCmd(ctx, args[1:], stderr)
	case "version":
		v := version
		if v == "" {
			v = buildinfo.Version()
		}
		fmt.Fprintln(stdout, "backstop", v)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return unknownCommand(args)
}
