//go:build conformance

package conformance

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// readSpecList reads a list of spec names, one a line, as ginkgo prints them without their tags
// ("[sig-node] Pods should support remote command execution over websockets"); blank lines and
// lines starting with # are comments.
func readSpecList(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read spec list: %w", err)
	}
	defer f.Close()
	var names []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if seen[line] {
			return nil, fmt.Errorf("spec list %s line %d: %q is listed twice", path, n, line)
		}
		seen[line] = true
		names = append(names, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read spec list %s: %w", path, err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("spec list %s names no spec", path)
	}
	return names, nil
}

// focusFor is a ginkgo --focus that selects the named specs: each name quoted and anchored at
// its end or the first tag that follows it (" [Conformance]"), so that "ConfigMap should be
// consumable from pods in volume" does not also select "... in volume with mappings". (Not at the
// start: ginkgo matches the focus against more than the spec's text, and "^" matched nothing;
// strictProblems catches a spec that runs without being listed.)
func focusFor(names []string) string {
	alts := make([]string, len(names))
	for i, n := range names {
		alts[i] = regexp.QuoteMeta(n)
	}
	return `(` + strings.Join(alts, "|") + `)( \[|$)`
}

// specNamed reports whether the JUnit spec name (the spec's text, its tags, then ginkgo's label
// list) is the listed name.
func specNamed(junitName, name string) bool {
	return junitName == name || strings.HasPrefix(junitName, name+" [")
}

// strictProblems says why a run does not pass as a whole: no spec ran, the run was interrupted,
// a spec did not pass, or a listed spec did not run (renamed or gone in this Kubernetes version).
// Empty when every selected spec ran and passed.
func strictProblems(specs []spec, res result, listed []string) []string {
	var p []string
	if res.total == 0 {
		p = append(p, "no spec ran (does the focus match any?)")
	}
	if res.selected > res.total {
		p = append(p, fmt.Sprintf("interrupted: ginkgo selected %d specs and %d ran", res.selected, res.total))
	}
	for _, f := range res.failures {
		p = append(p, fmt.Sprintf("did not pass: %s: %s", f.name, f.reason))
	}
	if len(listed) > 0 {
		for _, s := range specs {
			if strings.HasPrefix(s.Name, "(suite node) ") || s.Status == "skipped" || s.Status == "pending" {
				continue
			}
			if !slices.ContainsFunc(listed, func(n string) bool { return specNamed(s.Name, n) }) {
				p = append(p, fmt.Sprintf("ran but is not listed (the focus matched more than the list): %s", s.Name))
			}
		}
	}
	for _, n := range listed {
		ran := false
		for _, s := range specs {
			if specNamed(s.Name, n) && s.Status != "skipped" && s.Status != "pending" {
				ran = true
				break
			}
		}
		if !ran {
			p = append(p, fmt.Sprintf("listed but did not run (skipped, or no spec of that name in this e2e suite): %s", n))
		}
	}
	return p
}
