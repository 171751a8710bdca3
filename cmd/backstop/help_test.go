package main

import (
	"flag"
	"strings"
	"testing"
)

// Issue 13: `backstop CMD -h` prints that command's description, flags and
// an example, and succeeds (exit status 0): before, it printed the flags,
// then the whole usage, and failed; "policy show -h" answered `unknown
// preset "-h"` and "queue stats -h" `--queue is required`.
func TestEveryCommandAnswersHelp(t *testing.T) {
	for key, c := range commands {
		for _, h := range []string{"-h", "--help"} {
			args := append(strings.Fields(key), h)
			out, err := runCLI(t, "", args...)
			if err != nil {
				t.Errorf("%s: %v, want help and no error", strings.Join(args, " "), err)
				continue
			}
			for _, want := range []string{"usage: backstop " + c.synopsis + "\n", c.desc, "example:\n  " + c.example + "\n"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s: no %q in\n%s", strings.Join(args, " "), want, out)
				}
			}
			if strings.Contains(out, "commands:") {
				t.Errorf("%s: the whole usage is printed:\n%s", strings.Join(args, " "), out)
			}
			if !c.noFlags && !strings.Contains(out, "\nflags:\n  -") {
				t.Errorf("%s: no flags in\n%s", strings.Join(args, " "), out)
			}
		}
	}
	// -h after other arguments, and without the required ones.
	for _, args := range [][]string{{"queue", "stats", "-h"}, {"dlq", "replay", "--queue", "q", "-h"}, {"policy", "check", "critical", "-h"}} {
		if out, err := runCLI(t, "", args...); err != nil || !strings.HasPrefix(out, "usage: backstop "+args[0]+" "+args[1]) {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
	if out, err := runCLI(t, "", "policy", "-h"); err != nil || !strings.Contains(out, "commands:") {
		t.Errorf("policy -h: %v, want the usage\n%s", err, out)
	}
	if _, err := runCLI(t, "", "nope", "-h"); err == nil {
		t.Error("nope -h: no error")
	}
}

// Each help example is a command line the command accepts: its flags parse.
func TestHelpExamplesParse(t *testing.T) {
	for key, c := range commands {
		line := c.example
		if i := strings.Index(line, "| "); i >= 0 {
			line = line[i+2:]
		}
		if i := strings.Index(line, " >"); i >= 0 {
			line = line[:i]
		}
		words := strings.Fields(line)
		kw := strings.Fields(key)
		if len(words) < 1+len(kw) || words[0] != "backstop" || strings.Join(words[1:1+len(kw)], " ") != key {
			t.Errorf("%s: example %q does not run backstop %s", key, c.example, key)
			continue
		}
		if c.noFlags {
			continue
		}
		runCLI(t, "", append(kw, "-h")...)
		v, ok := flagSets.Load(key)
		if !ok {
			t.Fatalf("%s: no flag set", key)
		}
		fs := v.(*flag.FlagSet)
		rest := words[1+len(kw):]
		// Flags may follow the positional arguments (policy plot).
		for len(rest) > 0 {
			if err := fs.Parse(rest); err != nil {
				t.Errorf("%s: example %q: %v", key, c.example, err)
				break
			}
			rest = fs.Args()
			if len(rest) > 0 {
				rest = rest[1:]
			}
		}
	}
}
