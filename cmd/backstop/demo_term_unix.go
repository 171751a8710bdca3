//go:build unix

package main

import (
	"os"

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
