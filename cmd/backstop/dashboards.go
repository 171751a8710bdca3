package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/backstop-dev/backstop/dashboards"
)

// dashboardsGenerate writes the Grafana dashboards:
// `backstop dashboards generate --out DIR`.
func dashboardsGenerate(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("dashboards generate", flag.ContinueOnError)
	out := fs.String("out", "dashboards", "directory to write the dashboards' JSON into")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return errUsage
	}
	all := dashboards.All()
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := dashboards.Marshal(all[n])
		if err != nil {
			return err
		}
		path := filepath.Join(*out, n)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "wrote", path)
	}
	return nil
}
