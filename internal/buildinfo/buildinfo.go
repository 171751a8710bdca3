// Package buildinfo says which build of backstop is running when the
// linker was not told (-ldflags -X, as make build does): `go install
// ./cmd/backstop` and `go install github.com/backstop-dev/backstop/cmd/...@v1.2.3`
// builds carry their module version and VCS revision in the binary
// (runtime/debug.ReadBuildInfo), and the commands report those instead of
// an empty version.
package buildinfo

import (
	"runtime/debug"
)

// Version returns the main module's version from the build info: the
// tag of a `go install …@vX` build, or the pseudo-version Go derives from
// the VCS for a build in a clone (v0.0.0-20261206050000-0123456789ab,
// +dirty with uncommitted changes); else "devel" and the VCS revision,
// else "devel".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "devel"
	}
	return "devel-" + rev[:min(12, len(rev))] + dirty
}

// Revision returns the VCS revision the build info names, or "".
func Revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}
