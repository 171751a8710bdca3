//go:build !unix

package main

import "os"

// termSize: unknown here; the view is printed at full width.
func termSize(*os.File) (cols, rows int) { return 0, 0 }

// resized: no SIGWINCH here; the view follows the size at its next tick.
func resized() (ch <-chan os.Signal, stop func()) { return nil, func() {} }
