// Package cisuite is the test main of the conformance lane's CI subset (docs/testing.md, "The CI
// subset"): Kubernetes' own e2e suite set-up and the spec packages the subset draws from
// (test/e2e/common and test/e2e/node) only, so that `go test -c` of it compiles a quarter fewer
// packages than e2e.test's, which imports every SIG's specs and storage drivers (measured: 11.2
// against 14.6 minutes of CPU from an empty build cache; common/node alone needs pkg/kubelet).
//
// It lives under testdata so that mqlet's own module never compiles it: scripts/conformance-bins.sh
// --ci copies it into a throwaway module that requires k8s.io/kubernetes at the control plane's
// version, as it does for e2e.test.
//
// What it keeps from e2e.test's main (k8s.io/kubernetes/test/e2e/e2e_test.go): the same flags
// (framework.RegisterCommonFlags/RegisterClusterFlags and the framework config), the same suite
// set-up and run (package e2e's SynchronizedBeforeSuite and RunE2ETests, imported, not copied),
// the framework's failure dumps. What it leaves out: the other SIGs' spec packages, the
// -list-conformance-tests listing, the log-check invariant's flags and the progress reporter.
package cisuite

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"

	// Specs: package e2e itself imports test/e2e/common, which holds common/node (most
	// [sig-node] specs) and common/storage (ConfigMap, Secret, downward API volumes);
	// test/e2e/node holds the pod generation (observedGeneration) and PreStop specs.
	_ "k8s.io/kubernetes/test/e2e/node"

	// As e2e.test does: dump the namespace's events and pods, and the node's, when a spec fails;
	// gomega's formatting of Kubernetes objects.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s\n", flag.Args())
		os.Exit(1)
	}
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
