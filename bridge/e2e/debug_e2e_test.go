package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubectlDebug: what `kubectl debug --target` does, through the API's pods/ephemeralcontainers
// subresource (client-go's UpdateEphemeralContainers, kubectl's call), reaches the edge node as a
// pod update: the ephemeral container runs in the pod's network namespace and its target's PID
// namespace, its status comes back as ephemeralContainerStatuses, the other container is left
// running as it was, and it goes with the pod. kubectl debug itself too: with exec and logs into
// it, with -i (stdin through the attach), and with its default profile, whose SYS_PTRACE the
// node's policy refuses without disturbing the pod or its later deletion.
func TestKubectlDebug(t *testing.T) {
	w := newEdgeWorld(t)
	w.startBridge(t, "bridge-a")
	w.startAgent(t)
	s := &edgeSuite{w: w}
	ctx := context.Background()
	pods := w.kube.CoreV1().Pods(testNS)

	name := uniqueName("debugged")
	p := edgePod(name, edgeTolerations()...)
	p.Spec.Containers[0].Command = []string{"sh", "-c", "echo main-net=$(readlink /proc/self/ns/net); exec sleep 7777"}
	s.createPod(t, p)
	p = s.waitRunning(t, name)
	main := p.Status.ContainerStatuses[0]
	mainPid := w.tasks(t)[containerdID(main.ContainerID)]

	p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, v1.EphemeralContainer{TargetContainerName: "main",
		EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debugger", Image: p.Spec.Containers[0].Image,
			Command:                  []string{"sh", "-c", `echo dbg-net=$(readlink /proc/self/ns/net); echo dbg-pid1=$(tr '\0' ' ' < /proc/1/cmdline); exec sleep 3600`},
			TerminationMessagePolicy: v1.TerminationMessageReadFile}})
	if _, err := pods.UpdateEphemeralContainers(ctx, name, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update pods/ephemeralcontainers of %s: %v", name, err)
	}
	var dbg v1.ContainerStatus
	within(t, runBound, "ephemeral container debugger running in the API's status", func() (bool, string) {
		got, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		p = got
		for _, cs := range got.Status.EphemeralContainerStatuses {
			if cs.Name == "debugger" {
				dbg = cs
				return cs.State.Running != nil, podSummary(got) + " debugger " + cs.State.String()
			}
		}
		return false, podSummary(got) + " (no ephemeral container status yet)"
	})
	if dbg.ImageID == "" || dbg.ContainerID == "" || dbg.RestartCount != 0 || dbg.Ready {
		t.Errorf("debugger status %+v; want an image id, a container id, no restarts, not ready", dbg)
	}
	if _, ok := w.tasks(t)[containerdID(dbg.ContainerID)]; !ok {
		t.Errorf("debugger %s runs no task in containerd", dbg.ContainerID)
	}
	var log string
	within(t, runBound, "debugger's log written", func() (bool, string) {
		var err error
		log, err = w.containerLog(testNS, name, "debugger")
		return err == nil && strings.Contains(log, "dbg-pid1="), log
	})
	mainLog, err := w.containerLog(testNS, name, "main")
	if err != nil {
		t.Fatal(err)
	}
	mainNet, dbgNet := grepValue(mainLog, "main-net="), grepValue(log, "dbg-net=")
	if mainNet == "" || mainNet != dbgNet {
		t.Errorf("network namespace: main %q, debugger %q; want the same", mainNet, dbgNet)
	}
	if got := grepValue(log, "dbg-pid1="); got != "sleep 7777" {
		t.Errorf("debugger's /proc/1/cmdline %q; want its target's process, sleep 7777", got)
	}
	untouched := func(when string) {
		t.Helper()
		now := p.Status.ContainerStatuses[0]
		if now.ContainerID != main.ContainerID || now.RestartCount != 0 || w.tasks(t)[containerdID(main.ContainerID)] != mainPid || !podConditionTrue(p, v1.PodReady) {
			t.Errorf("main %s: %+v (task pid was %d); want the same running container and a Ready pod", when, now, mainPid)
		}
	}
	untouched("after the debugger was added")

	// kubectl debug itself, with the baseline profile: its default, general, adds the SYS_PTRACE
	// capability, which the node's default MQTT policy refuses (below). Then kubectl exec into it.
	image := p.Spec.Containers[0].Image
	if out, errOut, code := w.kubectl(t, "", 60*time.Second, "debug", name, "--image="+image, "--image-pull-policy=IfNotPresent",
		"--target=main", "--profile=baseline", "-c", "kdebug", "--", "sleep", "3600"); code != 0 {
		t.Fatalf("kubectl debug: exit %d, %s %s", code, out, errOut)
	}
	within(t, runBound, "kubectl debug's container kdebug running", func() (bool, string) {
		got, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cs := range got.Status.EphemeralContainerStatuses {
			if cs.Name == "kdebug" {
				return cs.State.Running != nil, cs.State.String()
			}
		}
		return false, podSummary(got)
	})
	out, errOut, code := w.kubectl(t, "", 60*time.Second, "exec", name, "-c", "kdebug", "--", "cat", "/proc/1/cmdline")
	if code != 0 || out != "sleep\x007777\x00" {
		t.Errorf("kubectl exec -c kdebug -- cat /proc/1/cmdline: %q (stderr %q, exit %d); want the target's sleep 7777", out, errOut, code)
	}

	if out, errOut, code := w.kubectl(t, "", 60*time.Second, "logs", name, "-c", "debugger"); code != 0 || !strings.Contains(out, "dbg-pid1=sleep 7777") {
		t.Errorf("kubectl logs -c debugger: %q (stderr %q, exit %d); want its output", out, errOut, code)
	}

	// kubectl debug -i: a debugger with stdin (stdinOnce), attached as soon as it runs; it reads a
	// line through the attach and prints it beside its target's process.
	out, errOut, code = w.kubectl(t, "from-debug\n", 120*time.Second, "debug", "-i", name, "--image="+image, "--image-pull-policy=IfNotPresent",
		"--target=main", "--profile=baseline", "-c", "idebug", "--", "sh", "-c", `read l; echo got:$l:$(tr '\0' ' ' < /proc/1/cmdline); exit 5`)
	if !strings.Contains(out, "got:from-debug:sleep 7777") {
		t.Errorf("kubectl debug -i: stdout %q, stderr %q, exit %d; want the line read through the attach and the target's process", out, errOut, code)
	}
	within(t, runBound, "idebug terminated with its exit code 5, not restarted", func() (bool, string) {
		got, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cs := range got.Status.EphemeralContainerStatuses {
			if cs.Name == "idebug" {
				return cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 5 && cs.RestartCount == 0, cs.State.String()
			}
		}
		return false, podSummary(got)
	})

	// The general profile's SYS_PTRACE: the node's policy refuses that ephemeral container (a
	// PolicyDenied event naming the capability) and admits the rest of the version without it.
	if out, errOut, code := w.kubectl(t, "", 60*time.Second, "debug", name, "--image="+image, "--image-pull-policy=IfNotPresent",
		"--target=main", "-c", "ptrace", "--", "sleep", "3600"); code != 0 {
		t.Fatalf("kubectl debug (general profile): exit %d, %s %s", code, out, errOut)
	}
	within(t, runBound, "a PolicyDenied event naming SYS_PTRACE", func() (bool, string) {
		evs, err := w.kube.EventsV1().Events(testNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Kind == "Pod" && e.Regarding.Name == name {
				seen = append(seen, e.Reason+": "+e.Note)
				if e.Reason == "PolicyDenied" && strings.Contains(e.Note, "SYS_PTRACE") {
					return true, ""
				}
			}
		}
		return false, strings.Join(seen, "; ")
	})
	p, err = pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	untouched("after two more ephemeral containers, one refused")
	// The refused one is reported terminated, PolicyDenied, never run; the pod takes later updates.
	within(t, runBound, "the refused ptrace container reported PolicyDenied", func() (bool, string) {
		p, err = pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cs := range p.Status.EphemeralContainerStatuses {
			if cs.Name == "ptrace" {
				tm := cs.State.Terminated
				return tm != nil && tm.Reason == "PolicyDenied" && strings.Contains(tm.Message, "SYS_PTRACE") && cs.ContainerID == "", fmt.Sprintf("%+v", cs)
			}
		}
		return false, fmt.Sprintf("%+v", p.Status.EphemeralContainerStatuses)
	})
	if cs := p.Status.EphemeralContainerStatuses; len(cs) != 4 {
		t.Errorf("ephemeral container statuses %v; want debugger, kdebug, idebug and the refused ptrace", cs)
	}

	if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitPodGone(t, p)
	if pid, ok := w.tasks(t)[containerdID(dbg.ContainerID)]; ok {
		t.Errorf("the pod is gone but its ephemeral container still runs (pid %d)", pid)
	}
}

// grepValue is what follows prefix on the first line of s that starts with it.
func grepValue(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), prefix); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
