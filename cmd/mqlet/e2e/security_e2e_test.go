package e2e

import (
	"strings"
	"testing"

	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

// runAsNonRoot with an image that runs as root: the container waits with kubelet's reason and
// message, the pod is not failed; a pod that also sets runAsUser runs, and its process and its
// emptyDir follow runAsUser and fsGroup.
func TestSecurityRunAsNonRootThroughAgent(t *testing.T) {
	h := newHarness(t)
	path, err := testenv.ArchiveWithUser(h.env.Image(testenv.Busybox), t.TempDir(), "mqlet.test/named:1", "nobody")
	if err != nil {
		t.Fatal(err)
	}
	h.mqlet("image", "import", path)
	h.writeManifest("rootimg.yaml", `apiVersion: v1
kind: Pod
metadata: {name: rootimg}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {runAsNonRoot: true}
  containers:
  - {name: app, image: mqlet.test/busybox:1, imagePullPolicy: Never, command: ["sleep", "3600"]}
`)
	h.writeManifest("named.yaml", `apiVersion: v1
kind: Pod
metadata: {name: named}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: mqlet.test/named:1
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    securityContext: {runAsNonRoot: true}
`)
	h.writeManifest("ids.yaml", `apiVersion: v1
kind: Pod
metadata: {name: ids}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000}
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: app
    image: mqlet.test/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "echo id=$(id -u):$(id -g) groups=$(id -G | tr ' ' ,) vol=$(stat -c %g /data); sleep 3600"]
    volumeMounts: [{name: data, mountPath: /data}]
`)
	h.startAgent()
	waiting := func(reason, msg string) func(*v1.Pod) bool {
		return func(p *v1.Pod) bool {
			w := containerStatus(p, "app").State.Waiting
			return p.Status.Phase == v1.PodPending && w != nil && w.Reason == reason && strings.Contains(w.Message, msg)
		}
	}
	h.waitPod("rootimg", "waiting with CreateContainerConfigError (image runs as root)",
		waiting("CreateContainerConfigError", `container has runAsNonRoot and image will run as root (pod: "rootimg_default(`))
	h.waitPod("named", "waiting with CreateContainerConfigError (non-numeric image user)",
		waiting("CreateContainerConfigError", "image has non-numeric user (nobody), cannot verify user is non-root"))
	p := h.waitPod("ids", "logging its ids", func(p *v1.Pod) bool { return strings.Contains(h.logOf(p, "app"), "vol=") })
	if log := h.logOf(p, "app"); !strings.Contains(log, "id=1000:3000 groups=3000,2000 vol=2000") {
		t.Errorf("ids pod logged %q, want uid 1000, gid 3000, groups 3000 and 2000 (fsGroup) and the volume's group 2000", log)
	}
	// Still waiting, not failed, after the others ran: kubelet retries a config error.
	if p, err := h.getPod("rootimg"); err != nil || p.Status.Phase != v1.PodPending {
		t.Errorf("rootimg: %v %s, want Pending", err, podSummaryForTest(p))
	}
}

const sysctlPod = `apiVersion: v1
kind: Pod
metadata: {name: tuned}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    sysctls:
    - {name: net.ipv4.ip_local_port_range, value: "41000 41100"}
    - {name: net.core.somaxconn, value: "777"}
  containers:
  - name: app
    image: mqlet.test/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "echo range=$(cat /proc/sys/net/ipv4/ip_local_port_range) somaxconn=$(cat /proc/sys/net/core/somaxconn); sleep 3600"]
`

// An unsafe sysctl is refused at admission, naming it, unless the agent's config allows it; then
// it and the safe one are set in the pod's network namespace. hostUsers: false is refused too.
func TestSecuritySysctlsThroughAgent(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("tuned.yaml", sysctlPod)
	h.writeManifest("userns.yaml", `apiVersion: v1
kind: Pod
metadata: {name: userns}
spec:
  hostUsers: false
  containers:
  - {name: app, image: mqlet.test/busybox:1, imagePullPolicy: Never, command: ["sleep", "3600"]}
`)
	h.startAgent()
	r := h.waitRejected("tuned.yaml", "net.core.somaxconn")
	if !strings.Contains(r.Reason, "spec.securityContext.sysctls[1].name") || !strings.Contains(r.Reason, "forbidden sysctl") ||
		strings.Contains(r.Reason, "ip_local_port_range") {
		t.Errorf("refusal %q: want the unsafe sysctl's field and name, and nothing about the safe one", r.Reason)
	}
	h.waitRejected("userns.yaml", "spec.hostUsers")
	h.stopAgent()

	h.startAgent("--allowed-unsafe-sysctl", "net.core.*")
	p := h.waitPod("tuned", "logging its sysctls", func(p *v1.Pod) bool { return strings.Contains(h.logOf(p, "app"), "somaxconn=") })
	if log := h.logOf(p, "app"); !strings.Contains(log, "range=41000 41100 somaxconn=777") {
		t.Errorf("tuned pod logged %q, want both sysctls applied", log)
	}
}
