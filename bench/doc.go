// Package bench holds the side-by-side benchmarks of backstop against the
// retry libraries people use today. Results, with the commands that
// produced them, are in BENCHMARKS.md.
package bench
