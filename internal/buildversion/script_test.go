package buildversion

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// semverRE is semver.org's regular expression for a version, with the leading v of Go and git tags.
var semverRE = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// TestVersionScript runs scripts/version.sh (what `make build` stamps) in a throwaway repository
// through its states: no tag, a tag, commits after it, a pre-release tag, uncommitted changes, a
// tag that is not semver, and no repository at all.
func TestVersionScript(t *testing.T) {
	script, err := filepath.Abs("../../scripts/version.sh")
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...)
		cmd.Dir = repo
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	commit := func(n int) {
		t.Helper()
		for range n {
			if err := os.WriteFile(filepath.Join(repo, "f"), []byte(git("rev-list", "--all", "--count")), 0o644); err != nil {
				t.Fatal(err)
			}
			git("add", "f")
			git("commit", "-q", "-m", "c")
		}
	}
	version := func(dir string) (string, error) {
		t.Helper()
		cmd := exec.Command("bash", script)
		cmd.Dir = dir
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(ee.Stderr), err
		}
		return strings.TrimSpace(string(out)), err
	}
	check := func(what, want string) {
		t.Helper()
		got, err := version(repo)
		if err != nil {
			t.Fatalf("%s: version.sh: %v: %s", what, err, got)
		}
		if !semverRE.MatchString(got) {
			t.Errorf("%s: %q is not a semantic version", what, got)
		}
		if want != got {
			t.Errorf("%s: version %q, want %q", what, got, want)
		}
	}
	short := func() string { return git("rev-parse", "--short=12", "HEAD") }

	git("init", "-q")
	commit(2)
	check("no tag", "v0.0.0-dev.2+g"+short())
	git("tag", "v0.1.0")
	check("on a tag", "v0.1.0")
	commit(3)
	check("after a tag", "v0.1.1-dev.3+g"+short())
	os.WriteFile(filepath.Join(repo, "f"), []byte("changed"), 0o644)
	check("uncommitted change", "v0.1.1-dev.3+g"+short()+".dirty")
	git("tag", "-a", "-m", "rc", "v0.2.0-rc.1") // annotated, as a release tag would be
	check("on a pre-release tag, dirty", "v0.2.0-rc.1+dirty")
	git("checkout", "-q", "f")
	commit(1)
	check("after a pre-release tag", "v0.2.0-rc.1.dev.1+g"+short())
	git("tag", "v1.10.9")
	check("two-digit fields", "v1.10.9")
	commit(1)
	check("patch bump", "v1.10.10-dev.1+g"+short())

	git("tag", "v2-beta")
	got, err := version(repo)
	if err == nil || !strings.Contains(got, "tag v2-beta is not a semantic version") {
		t.Errorf("a tag that is not semver: %q, %v; want an error naming it", got, err)
	}

	got, err = version(t.TempDir())
	if err != nil || got != "v0.0.0-dev+unknown" {
		t.Errorf("outside a repository: %q, %v", got, err)
	}
}
