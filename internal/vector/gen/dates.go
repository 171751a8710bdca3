package main

import "time"

func imf(ms int64) string { return time.UnixMilli(ms).UTC().Format("Mon, 02 Jan 2006 15:04:05 GMT") }
func rfc850(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("Monday, 02-Jan-06 15:04:05 GMT")
}
func asctime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.ANSIC) }
