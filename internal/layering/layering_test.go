package layering

import (
	"os/exec"
	"strings"
	"testing"
)

// deps lists every package pattern's transitive imports (test imports excluded), by go list.
func deps(t *testing.T, pattern string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pattern).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v\n%s", pattern, err, msg)
	}
	return strings.Fields(string(out))
}

// forbidden returns the imports of pattern that start with one of the prefixes.
func forbidden(t *testing.T, pattern string, prefixes ...string) []string {
	var bad []string
	for _, d := range deps(t, pattern) {
		for _, p := range prefixes {
			if strings.HasPrefix(d, p) {
				bad = append(bad, d)
			}
		}
	}
	return bad
}

// MQTT libraries the agent core must never link: it runs with no broker at all.
var mqttLibraries = []string{"github.com/eclipse/paho", "github.com/mochi-mqtt/", "github.com/hivemq/", "github.com/at-wat/mqtt-go"}

func TestAgentImportsNoMQTT(t *testing.T) {
	if bad := forbidden(t, "github.com/mqlet/mqlet/agent/...", mqttLibraries...); len(bad) > 0 {
		t.Errorf("agent/ imports an MQTT library: %v", bad)
	}
}

func TestSyncImportsNoContainerd(t *testing.T) {
	if bad := forbidden(t, "github.com/mqlet/mqlet/sync/...", "github.com/containerd/"); len(bad) > 0 {
		t.Errorf("sync/ imports containerd: %v", bad)
	}
}

// The check itself must be able to see a dependency: the agent does link containerd.
func TestCheckSeesDependencies(t *testing.T) {
	if bad := forbidden(t, "github.com/mqlet/mqlet/agent/...", "github.com/containerd/"); len(bad) == 0 {
		t.Errorf("go list found no containerd package under agent/: the check is blind")
	}
}

// The pod -> OCI spec translation is pure: it builds spec options and never talks to containerd,
// so it must not link the containerd client (agent/ctrd does).
func TestSpecTranslationImportsNoContainerdClient(t *testing.T) {
	if bad := forbidden(t, "github.com/mqlet/mqlet/agent/ctrspec", "github.com/containerd/containerd/v2/client"); len(bad) > 0 {
		t.Errorf("agent/ctrspec imports the containerd client: %v", bad)
	}
}

// stdNameExceptions are packages named like a standard one that predate this rule, with why they
// may stay: nothing that imports them needs the standard package beside them.
var stdNameExceptions = map[string]string{}

// No package is named like a standard library package: a name that shadows one (agent/runtime did,
// forcing goruntime aliases) makes every file that needs both pick an alias.
func TestNoPackageNamedLikeStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "std").Output()
	if err != nil {
		t.Fatalf("go list std: %v", err)
	}
	std := map[string]string{}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "internal") || strings.HasPrefix(p, "vendor/") {
			continue
		}
		std[p[strings.LastIndex(p, "/")+1:]] = p
	}
	out, err = exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Name}}", "github.com/mqlet/mqlet/...").Output()
	if err != nil {
		t.Fatalf("go list github.com/mqlet/mqlet/...: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, name, _ := strings.Cut(line, " ")
		if s, ok := std[name]; ok && stdNameExceptions[path] == "" {
			t.Errorf("package %s is named %s, like the standard library's %s: pick a name that says what it holds", path, name, s)
		}
	}
}
