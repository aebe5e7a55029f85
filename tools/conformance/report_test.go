//go:build conformance

package conformance

import (
	"encoding/xml"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// spec is one testcase of ginkgo's JUnit report.
type spec struct {
	Name    string `xml:"name,attr"`
	Status  string `xml:"status,attr"` // passed, failed, skipped, pending, panicked, interrupted, timedout, aborted
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"error"`
}

func readJUnit(path string) ([]spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Suites []struct {
			Cases []spec `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	var specs []spec
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			// The suite's set-up and tear-down nodes ([SynchronizedBeforeSuite], ...) are not
			// specs; a failure there shows as every spec failing.
			if !strings.HasPrefix(c.Name, "[It] ") {
				if c.Status != "passed" && c.Status != "skipped" {
					c.Name = "(suite node) " + c.Name
					specs = append(specs, c)
				}
				continue
			}
			c.Name = strings.TrimPrefix(c.Name, "[It] ")
			specs = append(specs, c)
		}
	}
	return specs, nil
}

type failed struct {
	name, group, reason string
}

type result struct {
	passed, total int
	// selected is how many specs ginkgo said it would run ("Will run N of M specs"); more than
	// total when the suite was interrupted (the specs that never started are not in total).
	selected int
	failures []failed
}

var willRun = regexp.MustCompile(`Will run (\d+) of (\d+) specs`)

// selectedSpecs reads ginkgo's "Will run N of M specs" from its output; 0 when absent.
func selectedSpecs(ginkgoLog string) int {
	b, err := os.ReadFile(ginkgoLog)
	if err != nil {
		return 0
	}
	m := willRun.FindSubmatch(b)
	if m == nil {
		return 0
	}
	n := 0
	fmt.Sscan(string(m[1]), &n)
	return n
}

func summarize(specs []spec) result {
	var r result
	for _, s := range specs {
		if s.Status == "skipped" || s.Status == "pending" {
			continue
		}
		r.total++
		if s.Status == "passed" {
			r.passed++
			continue
		}
		msg := ""
		if s.Failure != nil {
			msg = s.Failure.Message
			if msg == "" {
				msg = s.Failure.Text
			}
		} else if s.Error != nil {
			msg = s.Error.Message
		}
		group, reason := classify(s.Name, s.Status, msg)
		r.failures = append(r.failures, failed{name: s.Name, group: group, reason: reason})
	}
	sort.Slice(r.failures, func(i, j int) bool {
		if r.failures[i].group != r.failures[j].group {
			return r.failures[i].group < r.failures[j].group
		}
		return r.failures[i].name < r.failures[j].name
	})
	return r
}

// groups, tried in order on the spec's name and failure message; the first that matches names
// the failure's group. They are patterns, not a diagnosis: a reader checks a spec's reason line.
var groups = []struct {
	name string
	re   *regexp.Regexp
}{
	{"kubelet API (logs, exec, attach, port-forward, proxy through the node)", regexp.MustCompile(`(?i)nodes/proxy|/proxy/|containerLogs|get(ting)? logs|failed to get logs|error dialing backend|no such host|:10250|unable to upgrade connection|websocket|error sending request|the server could not find the requested resource.*(log|exec)`)},
	{"refused fields (the node refuses the pod; it stays Pending until the spec times out)", regexp.MustCompile(`(?i)NodeRefused|refused|restartPolicy: Always|ephemeral|image volume|Pending`)},
	{"status fidelity (init containers, observedGeneration, resize)", regexp.MustCompile(`(?i)PodInitializing|incomplete status|observedGeneration|allocatedResources|resize|ContainerCreating|ready: false`)},
	{"volumes (subPath)", regexp.MustCompile(`(?i)subpath`)},
	{"service environment variables", regexp.MustCompile(`(?i)SERVICE_HOST|enableServiceLinks|service env`)},
	{"images", regexp.MustCompile(`(?i)ErrImagePull|ImagePullBackOff|pull image|manifest unknown`)},
}

// Groups of the specs whose failure is understood (known).
const (
	notImplemented = "not implemented yet"
	notApplicable  = "not applicable to this lane or to an edge node"
)

// busyboxEnv explains the envFrom specs that fail in this lane only.
const busyboxEnv = "mqlet sets every envFrom key, names such as data-1 included (cmd/mqlet/e2e TestEnvFromConfigMapAndSecret reads one from the container's environment), but the spec reads them through `sh -c env`, and the lane's busybox is Debian's 1.35, whose sh leaves names that are not shell names out of the environment it gives env (Debian's 1.37, tried by hand, does the same); the spec is written for the upstream busybox image, which the lane cannot reach"

// known are the specs whose failure is understood, by a part of the spec's name: the reason says
// why, and the suite's own message follows. Checked before the patterns.
var known = []struct{ spec, group, why string }{
	{"Ephemeral Containers", notImplemented, "ephemeral containers run on the node (kubectl debug, -i and -it included; bridge/e2e TestKubectlDebug) and both specs passed in the lane on 2026-12-06 (commits de1a83c and dfe6ec9): a failure here is new, look at the suite's message"},
	{"ImageVolume should succeed", notApplicable, "image volumes work (agent/ctrd TestImageVolume), but the spec checks that the kitten image's /etc/os-release says Alpine Linux; the lane's kitten is agnhost on busybox, since upstream's alpine base is not reachable from the registries this project uses"},
	{"consumable via the environment", notApplicable, busyboxEnv},
	{"as environment variable names", notApplicable, busyboxEnv},
}

var spaces = regexp.MustCompile(`\s+`)

func classify(name, status, msg string) (group, reason string) {
	reason = strings.TrimSpace(spaces.ReplaceAllString(msg, " "))
	if reason == "" {
		reason = "ginkgo status " + status + " with no message"
	}
	if len(reason) > 300 {
		reason = reason[:300] + " …"
	}
	for _, k := range known {
		if strings.Contains(name, k.spec) {
			return k.group, k.why + ". The suite says: " + reason
		}
	}
	for _, g := range groups {
		if g.re.MatchString(msg) {
			return g.name, reason
		}
	}
	for _, g := range groups {
		if g.re.MatchString(name) {
			return g.name, reason
		}
	}
	return "other", reason
}

type reportInfo struct {
	procs       int
	runTime     time.Duration
	focus, skip string
	node        string
}

func renderReport(r result, info reportInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Kubernetes conformance: sig-node\n\n")
	fmt.Fprintf(&b, "Written by `make conformance` (scripts/conformance.sh, tools/conformance): Kubernetes' e2e suite\n")
	fmt.Fprintf(&b, "(`e2e.test` of k8s.io/kubernetes at the control plane's version) with ginkgo `--focus '%s'`\n", info.focus)
	fmt.Fprintf(&b, "`--skip '%s'`, %d processes, against a private control plane, mosquitto, mqlet-bridge and one\n", info.skip, info.procs)
	fmt.Fprintf(&b, "`mqlet agent` (node %s, the cluster's only node). The suite ran for %s on %s.\n\n",
		info.node, info.runTime.Round(time.Second), time.Now().UTC().Format("2006-01-02"))
	total := max(r.total, r.selected)
	fmt.Fprintf(&b, "%d of %d specs passed\n\n", r.passed, total)
	if total > r.total {
		fmt.Fprintf(&b, "The run was interrupted: %d of the %d selected specs never ran and count as not passed.\n\n", total-r.total, total)
	}
	if len(r.failures) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "## Specs that did not pass\n\n")
	fmt.Fprintf(&b, "Specs whose failure is understood are under %q or %q, with why (the table\n", notImplemented, notApplicable)
	fmt.Fprintf(&b, "`known` in tools/conformance/report_test.go); the others are grouped by patterns in the failure\n")
	fmt.Fprintf(&b, "message. Each line ends with the suite's own failure message, shortened.\n")
	last := ""
	for _, f := range r.failures {
		if f.group != last {
			n := 0
			for _, g := range r.failures {
				if g.group == f.group {
					n++
				}
			}
			fmt.Fprintf(&b, "\n### %s: %d\n\n", f.group, n)
			last = f.group
		}
		fmt.Fprintf(&b, "- %s: %s\n", f.name, strings.ReplaceAll(f.reason, "|", `\|`))
	}
	return b.String()
}
