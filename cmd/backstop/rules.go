package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/backstop-dev/backstop/dashboards"
	"github.com/backstop-dev/backstop/rules"
)

// rulesGenerate writes the Prometheus rule files from a configuration (the
// defaults without --config): `backstop rules generate --config FILE --out DIR`.
func rulesGenerate(args []string, stdout io.Writer) error {
	fs := newFlagSet("rules generate")
	config := fs.String("config", "", "rules configuration (YAML; see rules/config.yaml); default: the built-in defaults")
	out := fs.String("out", "rules", "directory to write backstop.rules.yml and backstop.alerts.yml into")
	if _, err := parseFlags(fs, args); err != nil {
		return err
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
	return writeFiles(*out, files, stdout)
}

// dashboardsGenerate writes the Grafana dashboards:
// `backstop dashboards generate --out DIR`.
func dashboardsGenerate(args []string, stdout io.Writer) error {
	fs := newFlagSet("dashboards generate")
	out := fs.String("out", "dashboards", "directory to write the dashboards' JSON into")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	files := map[string][]byte{}
	for name, d := range dashboards.All() {
		b, err := dashboards.Marshal(d)
		if err != nil {
			return err
		}
		files[name] = b
	}
	return writeFiles(*out, files, stdout)
}

// writeFiles writes generated files into dir, in name order, making dir
// first when it does not exist.
func writeFiles(dir string, files map[string][]byte, stdout io.Writer) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		path := filepath.Join(dir, n)
		if err := os.WriteFile(path, files[n], 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "wrote", path)
	}
	return nil
}
