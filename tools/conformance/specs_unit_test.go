//go:build conformance

package conformance

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// go test -tags conformance -run 'TestSpecList|TestStrict' ./tools/conformance/

func TestSpecListFocus(t *testing.T) {
	names, err := readSpecList("ci-specs.txt")
	if err != nil {
		t.Fatal(err)
	}
	// Each listed spec costs CI time (docs/testing.md, "The CI subset"): keep it short.
	if len(names) < 8 || len(names) > 20 {
		t.Errorf("ci-specs.txt lists %d specs; the CI subset is meant to be 8-20", len(names))
	}
	re := regexp.MustCompile(focusFor([]string{
		"[sig-storage] ConfigMap should be consumable from pods in volume",
		`[sig-node] Probing container should *not* be restarted with a exec "cat /tmp/health" liveness probe`,
	}))
	for text, want := range map[string]bool{
		"[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance] [Conformance]":                  true,
		"[sig-storage] ConfigMap should be consumable from pods in volume":                                                  true,
		"[sig-storage] ConfigMap should be consumable from pods in volume with mappings [NodeConformance] [Conformance]":    false,
		"[sig-storage] ConfigMap should be consumable from pods in volume as non-root [NodeConformance] [Conformance]":      false,
		`[sig-node] Probing container should *not* be restarted with a exec "cat /tmp/health" liveness probe [Conformance]`: true,
		`[sig-node] Probing container should be restarted with a exec "cat /tmp/health" liveness probe [Conformance]`:       false,
	} {
		if got := re.MatchString(text); got != want {
			t.Errorf("focus matches %q: %v, want %v", text, got, want)
		}
	}
}

func TestSpecListErrors(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"empty":  "# only a comment\n\n",
		"twice":  "[sig-node] A\n[sig-node] A\n",
		"absent": "",
	} {
		p := filepath.Join(dir, name)
		if name != "absent" {
			os.WriteFile(p, []byte(body), 0o644)
		}
		if _, err := readSpecList(p); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestStrictProblems(t *testing.T) {
	listed := []string{"[sig-node] A", "[sig-node] B", "[sig-node] C"}
	specs := []spec{
		{Name: "[sig-node] A [Conformance] [sig-node, Conformance]", Status: "passed"},
		{Name: "[sig-node] B [Conformance] [sig-node, Conformance]", Status: "failed"},
		{Name: "[sig-node] D [Conformance] [sig-node, Conformance]", Status: "passed"},
		{Name: "[sig-node] E [Conformance]", Status: "skipped"},
	}
	res := summarize(specs)
	got := strings.Join(strictProblems(specs, res, listed), "\n")
	for _, want := range []string{
		"did not pass: [sig-node] B",
		"ran but is not listed (the focus matched more than the list): [sig-node] D",
		"listed but did not run (skipped, or no spec of that name in this e2e suite): [sig-node] C",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q; got:\n%s", want, got)
		}
	}
	if strings.Contains(got, "[sig-node] A") || strings.Contains(got, "[sig-node] E") {
		t.Errorf("problems name a spec that passed or was skipped:\n%s", got)
	}

	ok := specs[:1]
	if p := strictProblems(ok, summarize(ok), listed[:1]); len(p) != 0 {
		t.Errorf("a run where the one listed spec passed has problems: %v", p)
	}
	if p := strictProblems(nil, summarize(nil), nil); len(p) == 0 {
		t.Error("a run where no spec ran has no problem")
	}
	interrupted := summarize(ok)
	interrupted.selected = 3
	if p := strictProblems(ok, interrupted, nil); len(p) == 0 {
		t.Error("an interrupted run has no problem")
	}
}
