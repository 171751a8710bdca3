//go:build unix

package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// termSize is the terminal's columns and rows when f is one, else 0, 0.
func termSize(f *os.File) (cols, rows int) {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, 0
	}
	return int(ws.Col), int(ws.Row)
}

// resized tells when the terminal is resized (SIGWINCH), so the live view
// redraws at once rather than at its next tick; stop ends it.
func resized() (ch <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, unix.SIGWINCH)
	return c, func() { signal.Stop(c) }
}
