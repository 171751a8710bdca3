//go:build !wasip1

package policy

import "time"

// Delay returns DelayMs as a time.Duration.
//
// # Notes
//
// It is left out of wasip1 builds: package time costs backstop.wasm about
// 280 KB (duration.go).
func (d Decision) Delay() time.Duration { return time.Duration(d.DelayMs) * time.Millisecond }
