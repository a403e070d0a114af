package main

import (
	"runtime/debug"
	"strings"
)

func init() {
	if version == "" {
		info, _ := debug.ReadBuildInfo()
		version = buildVersion(info)
	}
}

// buildVersion names the version of a binary whose version was not set by
// -ldflags: the module version for `go install …@v1.2.3`, otherwise
// "devel" with the VCS revision the binary was built from (and "-dirty"
// for a modified checkout) when the build recorded it.
func buildVersion(info *debug.BuildInfo) string {
	if info == nil {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "devel"
	}
	var b strings.Builder
	b.WriteString("devel-")
	b.WriteString(rev[:min(12, len(rev))])
	if modified == "true" {
		b.WriteString("-dirty")
	}
	return b.String()
}
