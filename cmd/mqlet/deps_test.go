package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// forbiddenDeps are module paths the edge binary must never link: client-go belongs to
// mqlet-bridge (it would add megabytes and its informer machinery to a binary for small devices).
var forbiddenDeps = []string{"k8s.io/client-go"}

// TestNoClientGo lists every package cmd/mqlet links, as `make build` builds it (CGO_ENABLED=0,
// -tags grpcnotrace) and with default tags, and fails naming each forbidden one and the package
// that imports it.
func TestNoClientGo(t *testing.T) {
	// go test puts its own GOROOT/bin first on the test's PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list cmd/mqlet's dependencies: %v", err)
	}
	for _, tags := range []string{"", "grpcnotrace"} {
		cmd := exec.Command(goBin, "list", "-deps", "-tags="+tags,
			"-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("go list -deps -tags=%q .: %v\n%s", tags, err, stderr)
		}
		pkgs := 0
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			pkgs++
			if forbidden(fields[0]) {
				continue // report only where the forbidden tree is entered, not its insides
			}
			for _, imp := range fields[1:] {
				if forbidden(imp) {
					t.Errorf("cmd/mqlet (tags %q) links %s, imported by %s; client-go may only be used by mqlet-bridge", tags, imp, fields[0])
				}
			}
		}
		// A listing that lost the dependency graph would pass vacuously.
		if pkgs < 50 {
			t.Fatalf("go list -deps listed only %d packages for cmd/mqlet; the check cannot be trusted", pkgs)
		}
	}
}

func forbidden(pkg string) bool {
	for _, bad := range forbiddenDeps {
		if pkg == bad || strings.HasPrefix(pkg, bad+"/") {
			return true
		}
	}
	return false
}
