package policy

import "strconv"

// itoa formats an integer in decimal. Error texts are built with it and
// strconv.Quote rather than fmt, which would link fmt and reflect into
// backstop.wasm (about 225 KB of code) for a few messages.
func itoa[T int | int64](n T) string { return strconv.FormatInt(int64(n), 10) }
