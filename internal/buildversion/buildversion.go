// Package buildversion gives both binaries the version and commit they report (`--version`, node
// status, the bridge's user agent). `make build` stamps them from scripts/version.sh; a plain
// `go build` is not stamped, and gets a version from the VCS facts the go command embeds instead,
// so that no binary reports a bare "dev".
package buildversion

import (
	"runtime/debug"
)

// Unstamped is the version of a build without -X stamps nor VCS facts (go test, go run): 0.0.0
// sorts before every released version.
const Unstamped = "v0.0.0-dev"

// Resolve returns stamped (version, commit) where the build was stamped, else what the build info
// read holds: version v0.0.0-dev+g<12 hex>[.dirty] and that commit, as scripts/version.sh prints
// for a checkout without tags.
func Resolve(stampedVersion, stampedCommit string, read func() (*debug.BuildInfo, bool)) (version, commit string) {
	version, commit = stampedVersion, stampedCommit
	var rev string
	var modified bool
	if info, ok := read(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if commit == "" {
		commit = "unknown"
		if rev != "" {
			commit = rev
		}
	}
	if version == "" {
		version = Unstamped
		if rev != "" {
			version += "+g" + rev
			if modified {
				version += ".dirty"
			}
		}
	}
	return version, commit
}
