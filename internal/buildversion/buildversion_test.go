package buildversion

import (
	"runtime/debug"
	"testing"
)

func info(settings ...string) func() (*debug.BuildInfo, bool) {
	return func() (*debug.BuildInfo, bool) {
		bi := &debug.BuildInfo{}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi, true
	}
}

func TestResolve(t *testing.T) {
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	const rev = "8ecc4477fc1e0123456789abcdef0123456789ab"
	for _, tc := range []struct {
		name             string
		version, commit  string
		read             func() (*debug.BuildInfo, bool)
		wantVer, wantCom string
	}{
		{"stamped by make", "v1.2.3", "8ecc4477fc1e", info("vcs.revision", rev, "vcs.modified", "true"), "v1.2.3", "8ecc4477fc1e"},
		{"go build in a checkout", "", "", info("vcs.revision", rev, "vcs.modified", "false"), "v0.0.0-dev+g8ecc4477fc1e", "8ecc4477fc1e"},
		{"go build with changes", "", "", info("vcs.revision", rev, "vcs.modified", "true"), "v0.0.0-dev+g8ecc4477fc1e.dirty", "8ecc4477fc1e"},
		{"go test: no vcs facts", "", "", info(), "v0.0.0-dev", "unknown"},
		{"no build info", "", "", none, "v0.0.0-dev", "unknown"},
	} {
		v, c := Resolve(tc.version, tc.commit, tc.read)
		if v != tc.wantVer || c != tc.wantCom {
			t.Errorf("%s: Resolve = %q, %q; want %q, %q", tc.name, v, c, tc.wantVer, tc.wantCom)
		}
	}
}
