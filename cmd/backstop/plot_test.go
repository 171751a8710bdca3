package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkChartFile fails t unless path holds a well-formed SVG document or
// a PNG image (by its extension) of a sane size.
func checkChartFile(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 1000 || len(b) > 4<<20 {
		t.Fatalf("%s: %d bytes", path, len(b))
	}
	if strings.HasSuffix(path, ".png") {
		if _, err := png.Decode(bytes.NewReader(b)); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return
	}
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		if _, err := d.Token(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
}

func TestPolicyPlotWritesSVGAndPNG(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mine.yaml")
	os.WriteFile(file, []byte("max_attempts: 8\nbackoff: {strategy: decorrelated, base: 50ms, cap: 2s}\njitter: {mode: decorrelated}\n"), 0o644)
	for _, out := range []string{filepath.Join(dir, "a.svg"), filepath.Join(dir, "a.png")} {
		// Flags may follow the policy, as the usage shows.
		got, err := runCLI(t, "", "policy", "plot", "critical", "--out", out, "--compare", "fast-transient,"+file, "--draws", "200")
		if err != nil {
			t.Fatal(err)
		}
		if got != "wrote "+out+"\n" {
			t.Errorf("output %q", got)
		}
		checkChartFile(t, out)
	}
	for _, args := range [][]string{
		{"policy", "plot", "default"},                                       // no --out
		{"policy", "plot", "default", "--out", filepath.Join(dir, "a.gif")}, // unknown format
		{"policy", "plot", "no-such-policy", "--out", filepath.Join(dir, "b.svg")},
	} {
		if _, err := runCLI(t, "", args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "b.svg")); err == nil {
		t.Error("a failed plot left a file behind")
	}
}

func TestPolicyCheckChart(t *testing.T) {
	out, err := runCLI(t, "", "policy", "check", "--chart", "default")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "attempt 5 is the last") || !strings.Contains(out, "4 │█████████████████████████░") {
		t.Errorf("no chart under the table:\n%s", out)
	}
	if out, _ := runCLI(t, "", "policy", "check", "default"); strings.Contains(out, "█") {
		t.Error("a chart without --chart")
	}
}
