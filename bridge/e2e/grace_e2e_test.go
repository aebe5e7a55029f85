package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeleteGracePeriodFromAPI: a delete's grace period (metadata.deletionGracePeriodSeconds, what
// `kubectl delete --grace-period` sets) is the one the node kills with, not the pod spec's, and a
// second delete with a shorter one shortens a termination under way, as kubelet does. The pods'
// spec grace is an hour and their container ignores SIGTERM, so only the API's grace lets them go
// within the test's bounds; the agent's log shows the SIGKILL came after that grace.
func TestDeleteGracePeriodFromAPI(t *testing.T) {
	w := newEdgeWorld(t)
	w.startBridge(t, "bridge-a")
	w.startAgent(t)
	s := &edgeSuite{w: w}
	ctx := context.Background()

	within(t, readyBound, "Node "+edgeNode+" says it takes the API's deletions", func() (bool, string) {
		n, err := w.kube.CoreV1().Nodes().Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		v := n.Annotations[protocol.AnnotationPodDeletion]
		return v == protocol.PodDeletionGraceful, fmt.Sprintf("%s=%q", protocol.AnnotationPodDeletion, v)
	})

	hour := int64(3600)
	stubborn := func(name string) *v1.Pod {
		p := edgePod(name, edgeTolerations()...)
		p.Spec.TerminationGracePeriodSeconds = &hour
		// SIGTERM is noted in the log and otherwise ignored: only SIGKILL ends it.
		p.Spec.Containers[0].Command = []string{"sh", "-c", `trap "echo got-TERM" TERM; echo started; while true; do sleep 1; done`}
		return p
	}
	direct, shortened := uniqueName("grace"), uniqueName("shorter")
	s.createPod(t, stubborn(direct))
	s.createPod(t, stubborn(shortened))
	pd, ps := s.waitRunning(t, direct), s.waitRunning(t, shortened)
	idDirect := containerdID(pd.Status.ContainerStatuses[0].ContainerID)
	idShort := containerdID(ps.Status.ContainerStatuses[0].ContainerID)

	del := func(name string, grace int64) {
		t.Helper()
		if err := w.kube.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatalf("delete pod %s with grace %d: %v", name, grace, err)
		}
	}
	// One pod deleted with 3 s at once; the other with 600 s, and once its container has had
	// its SIGTERM (the termination is under way with 600 s), again with 3 s.
	deleted := time.Now()
	del(direct, 3)
	del(shortened, 600)
	within(t, runBound, "pod "+shortened+"'s container got its SIGTERM", func() (bool, string) {
		out, err := w.containerLog(testNS, shortened, "main")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(out, "got-TERM"), out
	})
	del(shortened, 3)

	for _, p := range []*v1.Pod{pd, ps} {
		w.waitPodGone(t, p)
		t.Logf("pod %s gone from the API %s after its first delete (spec grace %ds)", p.Name, time.Since(deleted).Round(100*time.Millisecond), hour)
	}
	for _, id := range []string{idDirect, idShort} {
		if pid, ok := w.tasks(t)[id]; ok {
			t.Errorf("the API pod is gone but its container %s still runs (pid %d)", id, pid)
		}
	}

	// The evidence of how each container ended: the agent's SIGKILL after a 3 s grace, and for
	// the second pod the termination with 600 s cut short first.
	log := w.agent.log()
	for _, id := range []string{idDirect, idShort} {
		re := regexp.MustCompile(`msg="grace period over, killing"[^\n]* container=` + regexp.QuoteMeta(id) + `[^\n]* grace=(\S+)`)
		m := re.FindStringSubmatch(log)
		switch {
		case m == nil:
			t.Errorf("the agent's log has no SIGKILL of container %s after its grace period:\n%s", id, grepLines(log, id))
		case m[1] != "3s":
			t.Errorf("container %s was killed after a grace of %s, want the API's 3s", id, m[1])
		}
	}
	if !regexp.MustCompile(`msg="grace period shortened; stopping the pod again with the shorter one"[^\n]* pod=\S*` +
		regexp.QuoteMeta(shortened) + `[^\n]* was=10m0s`).MatchString(log) {
		t.Errorf("the agent's log does not show pod %s's 600 s termination cut short:\n%s", shortened, grepLines(log, shortened))
	}
}
