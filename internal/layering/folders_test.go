package layering

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the import path every package of this repository starts with.
const module = "github.com/mqlet/mqlet/"

// A folderRule says which of the repository's packages the packages under one top-level folder may
// link, directly or not: their own folder's, and those under the folders (or single packages)
// listed in may. Packages outside the module (the standard library, k8s.io, ...) are not its
// business; the MQTT and containerd tests above are.
type folderRule struct {
	folder string
	may    []string
	tests  bool // the rule holds for the folder's tests too, not only for what its binaries link
	why    string
}

// The folders in the order imports run: core/ and hw/ are leaves, store/ holds state, sync/ carries
// it over MQTT, the agent runs pods, bridge/ is the cloud side; only cmd/ (and internal/'s test
// environments) put them together.
var folderRules = []folderRule{
	{folder: "core", tests: true,
		why: "core/ holds the types and helpers the other folders share; it can import none of them"},
	{folder: "hw", tests: true,
		why: "hw/ reads the machine; everything else reads it through hw/"},
	{folder: "store", may: []string{"core"}, tests: true,
		why: "the state file knows the shared types only, not the agent that fills it nor the link that drains it"},
	{folder: "sync", may: []string{"core", "store", "internal"}, tests: true,
		why: "the MQTT side links no agent/ (it carries the agent's records, it does not run pods) and no bridge/"},
	{folder: "bridge", may: []string{"core", "sync"},
		why: "mqlet-bridge links no agent/ code: what it shares with the edge is in core/ and sync/ " +
			"(its tests may: bridge/e2e runs a real edge agent, bridge/pods checks its pods pass the edge's admission)"},
	{folder: "agent", may: []string{"core", "store", "hw", "internal", "sync/protocol", "sync/broker", "sync/signing"}, tests: true,
		why: "the agent links no bridge/ and of sync/ only the contract (protocol, broker addresses, signing keys its config checks), never the MQTT client side"},
}

// linked maps each package matching pattern (with its test variants when tests is set) to the
// module's packages it links, directly or not.
func linked(t *testing.T, pattern string, tests bool) map[string][]string {
	t.Helper()
	args := []string{"list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}"}
	if tests {
		args = append(args, "-test")
	}
	cmd := exec.Command("go", append(args, pattern)...)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, msg)
	}
	m := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		// A test variant is listed as "p [p.test]"; its Deps follow the bracket.
		pkg, deps := f[0], f[1:]
		if len(deps) > 0 && strings.HasPrefix(deps[0], "[") {
			pkg, deps = pkg+" (with its tests)", deps[1:]
		}
		for _, d := range deps {
			if strings.HasPrefix(d, module) {
				m[pkg] = append(m[pkg], strings.TrimPrefix(d, module))
			}
		}
	}
	return m
}

// under says whether the module-relative path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// violations lists, for rule r, every "pkg links dep" the rule forbids.
func violations(t *testing.T, r folderRule) []string {
	var bad []string
	for pkg, deps := range linked(t, module+r.folder+"/...", r.tests) {
		for _, d := range deps {
			if under(d, r.folder) || slices.ContainsFunc(r.may, func(m string) bool { return under(d, m) }) {
				continue
			}
			bad = append(bad, fmt.Sprintf("%s links %s", strings.TrimPrefix(pkg, module), d))
		}
	}
	slices.Sort(bad)
	return slices.Compact(bad)
}

// TestFoldersImportOneWay checks the import rules between the top-level folders.
func TestFoldersImportOneWay(t *testing.T) {
	for _, r := range folderRules {
		t.Run(r.folder, func(t *testing.T) {
			if bad := violations(t, r); len(bad) > 0 {
				if len(bad) > 20 {
					bad = append(bad[:20], fmt.Sprintf("... and %d more", len(bad)-20))
				}
				t.Errorf("%s/ may link only %v of this module (%s); found:\n  %s",
					r.folder, append([]string{r.folder}, r.may...), r.why, strings.Join(bad, "\n  "))
			}
		})
	}
}

// TestOnlyAgentConfigImportsSync: of the agent's packages only its config imports sync/ (to check
// the broker address, topic prefix and signing keys a config names); the rest get what they need
// from the config, so the MQTT contract enters the agent in one place.
func TestOnlyAgentConfigImportsSync(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"agent/...").Output()
	if err != nil {
		t.Fatalf("go list agent/...: %v", err)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == module+"agent/config" {
			continue
		}
		for _, d := range f[1:] {
			if under(strings.TrimPrefix(d, module), "sync") && strings.HasPrefix(d, module) {
				t.Errorf("%s imports %s: only agent/config may import sync/", strings.TrimPrefix(f[0], module), d)
			}
		}
	}
}
