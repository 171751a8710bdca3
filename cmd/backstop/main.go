// Command backstop checks retry policies and asks them for decisions.
//
//	backstop policy check FILE|PRESET   validate and print the schedule
//	backstop policy presets             list the presets
//	backstop policy show PRESET         print a preset's policy file
//	backstop decide --policy FILE|PRESET
//	                                    JSON lines in, decisions out, through backstop.wasm
//	backstop version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
)

const usage = `usage: backstop <command> [arguments]

commands:
  policy check FILE|PRESET    validate a policy and print its retry schedule
  policy presets              list the named presets
  policy show PRESET          print a preset's policy file
  decide --policy FILE|PRESET read failures as JSON lines on stdin, write
                              decisions as JSON lines, through backstop.wasm
  version                     print the version
`

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// errUsage marks errors that should print the usage text.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "backstop:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	switch args[0] {
	case "policy":
		if len(args) < 2 {
			return errUsage
		}
		switch args[1] {
		case "check":
			return policyCheck(args[2:], stdout)
		case "presets":
			return policyPresets(stdout)
		case "show":
			return policyShow(args[2:], stdout)
		}
	case "decide":
		return decide(ctx, args[1:], stdin, stdout)
	case "version":
		fmt.Fprintln(stdout, "backstop", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return errUsage
}
