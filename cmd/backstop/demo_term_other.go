//go:build !unix

package main

import "os"

// termSize: unknown here; the view is printed at full width.
func termSize(*os.File) (cols, rows int) { return 0, 0 }
