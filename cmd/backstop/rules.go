package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/backstop-dev/backstop/rules"
)

// rulesGenerate writes the Prometheus rule files from a configuration (the
// defaults without --config): `backstop rules generate --config FILE --out DIR`.
func rulesGenerate(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rules generate", flag.ContinueOnError)
	config := fs.String("config", "", "rules configuration (YAML; see rules/config.yaml); default: the built-in defaults")
	out := fs.String("out", "rules", "directory to write backstop.rules.yml and backstop.alerts.yml into")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return errUsage
	}
	c := rules.Default()
	if *config != "" {
		var err error
		if c, err = rules.LoadConfig(*config); err != nil {
			return err
		}
	}
	files, err := rules.Files(c)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		path := filepath.Join(*out, n)
		if err := os.WriteFile(path, files[n], 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "wrote", path)
	}
	return nil
}
