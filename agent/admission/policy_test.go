package admission

import (
	"errors"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
)

func policyPod(mutate func(*v1.Pod)) *v1.Pod {
	p := &v1.Pod{}
	p.Name, p.Namespace = "web", "apps"
	p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox:1"}}
	p.Spec.Containers = []v1.Container{{Name: "main", Image: "busybox:1"}, {Name: "side", Image: "busybox:1"}}
	if mutate != nil {
		mutate(p)
	}
	return p
}

// debugger is an ephemeral container as kubectl debug --target main adds it, with sc.
func debugger(sc *v1.SecurityContext) v1.EphemeralContainer {
	return v1.EphemeralContainer{TargetContainerName: "main", EphemeralContainerCommon: v1.EphemeralContainerCommon{
		Name: "debugger", Image: "busybox:1", Stdin: true, TTY: true, SecurityContext: sc}}
}

func yes() *bool { t := true; return &t }
func no() *bool  { f := false; return &f }

func hostPathVolume(name, path string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path}}}
}

func TestMQTTPolicy(t *testing.T) {
	strict := Policy{}
	paths := Policy{AllowedHostPaths: []string{"/data", "/var/log/app"}}
	tests := []struct {
		name   string
		policy Policy
		mutate func(*v1.Pod)
		wants  []string // empty: admitted
	}{
		{"plain pod", strict, nil, nil},
		{"privileged", strict, func(p *v1.Pod) { p.Spec.Containers[1].SecurityContext = &v1.SecurityContext{Privileged: yes()} },
			[]string{"pod apps/web", "spec.containers[1].securityContext.privileged", "mqttPolicy.allowPrivileged"}},
		{"privileged false", strict, func(p *v1.Pod) { p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: no()} }, nil},
		{"privileged init container", strict, func(p *v1.Pod) { p.Spec.InitContainers[0].SecurityContext = &v1.SecurityContext{Privileged: yes()} },
			[]string{"spec.initContainers[0].securityContext.privileged", "mqttPolicy.allowPrivileged"}},
		{"privileged allowed", Policy{AllowPrivileged: true}, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: yes(), AllowPrivilegeEscalation: yes(),
				Capabilities: &v1.Capabilities{Add: []v1.Capability{"ALL"}}}
		}, nil},
		{"privilege escalation", strict, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{AllowPrivilegeEscalation: yes()}
		},
			[]string{"spec.containers[0].securityContext.allowPrivilegeEscalation", "mqttPolicy.allowPrivileged"}},
		{"no privilege escalation", strict, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{AllowPrivilegeEscalation: no()}
		}, nil},
		{"baseline capabilities", strict, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{
				Add: []v1.Capability{"NET_BIND_SERVICE", "cap_chown"}, Drop: []v1.Capability{"ALL"}}}
		}, nil},
		{"SYS_ADMIN", strict, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"CHOWN", "SYS_ADMIN"}}}
		}, []string{"spec.containers[0].securityContext.capabilities.add[1]", `"SYS_ADMIN"`, "mqttPolicy.allowPrivileged"}},
		{"net_admin with prefix and lower case", strict, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"cap_net_admin"}}}
		}, []string{"capabilities.add[0]", `"cap_net_admin"`}},
		{"ALL", strict, func(p *v1.Pod) {
			p.Spec.InitContainers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"ALL"}}}
		}, []string{"spec.initContainers[0].securityContext.capabilities.add[0]", `"ALL"`}},
		// kubectl debug through the bridge: an ephemeral container is held to the same policy.
		{"privileged ephemeral container beside a privileged app container", strict, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: yes()}
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{debugger(&v1.SecurityContext{Privileged: yes()})}
		},
			[]string{"spec.containers[0].securityContext.privileged", "spec.ephemeralContainers[0].securityContext.privileged", "mqttPolicy.allowPrivileged"}},
		{"plain ephemeral container", strict, func(p *v1.Pod) { p.Spec.EphemeralContainers = []v1.EphemeralContainer{debugger(nil)} }, nil},
		{"SYS_PTRACE in an ephemeral container, allowed for debugging", Policy{AllowDebugPtrace: true}, func(p *v1.Pod) {
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{debugger(&v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_PTRACE"}}})}
		}, nil},
		{"SYS_PTRACE in an app container, with only debugging allowed", Policy{AllowDebugPtrace: true}, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_PTRACE"}}}
		}, []string{"spec.containers[0].securityContext.capabilities.add[0]", `"SYS_PTRACE"`, "mqttPolicy.allowPrivileged"}},
		{"SYS_PTRACE and SYS_ADMIN in a debugger, with only debugging allowed", Policy{AllowDebugPtrace: true}, func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: yes()} // so the pod is refused whole
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{debugger(&v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_PTRACE", "SYS_ADMIN"}}})}
		}, []string{"spec.ephemeralContainers[0].securityContext.capabilities.add[1]", `"SYS_ADMIN"`}},
		{"hostNetwork", strict, func(p *v1.Pod) { p.Spec.HostNetwork = true },
			[]string{"spec.hostNetwork", "mqttPolicy.allowHostNamespaces"}},
		{"hostPID", strict, func(p *v1.Pod) { p.Spec.HostPID = true }, []string{"spec.hostPID", "mqttPolicy.allowHostNamespaces"}},
		{"hostIPC", strict, func(p *v1.Pod) { p.Spec.HostIPC = true }, []string{"spec.hostIPC", "mqttPolicy.allowHostNamespaces"}},
		{"host namespaces allowed", Policy{AllowHostNamespaces: true}, func(p *v1.Pod) {
			p.Spec.HostNetwork, p.Spec.HostPID, p.Spec.HostIPC = true, true, true
		}, nil},
		{"hostPath with no allowed paths", strict, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/data")} },
			[]string{"spec.volumes[0].hostPath.path", `"/data"`, "mqttPolicy.allowedHostPaths", "no hostPath"}},
		{"hostPath equal", paths, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/data")} }, nil},
		{"hostPath below", paths, func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "e", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
				hostPathVolume("d", "/data/sensors/x"), hostPathVolume("l", "/var/log/app/")}
		}, nil},
		{"hostPath sharing a prefix but not a segment", paths, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/database")} },
			[]string{"spec.volumes[0].hostPath.path", `"/database"`, "not under an allowed path (/data, /var/log/app)"}},
		{"hostPath above", paths, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/var/log")} },
			[]string{`"/var/log"`, "not under"}},
		{"hostPath root", paths, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/")} }, []string{`"/"`}},
		{"hostPath with ..", paths, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/data/../etc")} },
			[]string{"spec.volumes[0].hostPath.path", `"/data/../etc"`, "'..'"}},
		{"hostPath with .. that stays inside", paths, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/data/a/../b")} },
			[]string{"'..'"}},
		{"relative hostPath", paths, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "data/x")} },
			[]string{`"data/x"`, "absolute"}},
		{"everything at once", paths, func(p *v1.Pod) {
			p.Spec.HostNetwork = true
			p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/etc")}
			p.Spec.Containers[1].SecurityContext = &v1.SecurityContext{Privileged: yes()}
		}, []string{"spec.hostNetwork", "spec.volumes[0].hostPath.path", "spec.containers[1].securityContext.privileged"}},
		{"a bad allowed prefix widens nothing", Policy{AllowedHostPaths: []string{"/data/", "data", "/x/../"}},
			func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/data/x")} }, []string{`"/data/x"`}},
		{"allowed root", Policy{AllowedHostPaths: []string{"/"}}, func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/etc")} }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := Admitter{NodeName: node, MQTTPolicy: tt.policy}
			pod := policyPod(tt.mutate)
			got, err := a.Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.MQTT, Origin: "mqlet/v2/nodes/edge-1/desired/pods/apps/web"}, Generation: 3})
			if len(tt.wants) == 0 {
				if err != nil {
					t.Fatalf("want admitted, got %v", err)
				}
				if got == nil || got.UID == "" {
					t.Fatalf("admitted pod %+v", got)
				}
				if r := RefusedEphemeralContainers(got); len(r) > 0 || len(got.Spec.EphemeralContainers) != len(pod.Spec.EphemeralContainers) {
					t.Fatalf("admitted with ephemeral containers left out: %+v", r)
				}
				return
			}
			var pe *PolicyError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v (%T), want a *PolicyError", err, err)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}

			// The manifest dir is trusted: the same pod from a file is admitted.
			if _, err := a.Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.File, Origin: "/etc/mqlet/pods/web.yaml"}}); err != nil {
				t.Errorf("file pod refused: %v", err)
			}
		})
	}
}

// A pod that is invalid and against the policy gets every problem in one plain error: it is a
// rejection first, not a policy decision.
func TestPolicyWithValidationErrors(t *testing.T) {
	pod := policyPod(func(p *v1.Pod) {
		p.Spec.Containers[0].Image = ""
		p.Spec.HostPID = true
	})
	_, err := Admitter{NodeName: node}.Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.MQTT, Origin: "t"}})
	if err == nil {
		t.Fatal("admitted")
	}
	var pe *PolicyError
	if errors.As(err, &pe) {
		t.Errorf("got a *PolicyError for an invalid pod: %v", err)
	}
	for _, w := range []string{"spec.containers[0].image: Required value", "spec.hostPID", "mqttPolicy.allowHostNamespaces"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// An admitted MQTT pod carries, for each hostPath volume, the outermost allowed path it lies under
// (the runtime opens the path beneath it at mount time); what a source sends under that key is
// dropped, for every source, so no pod names its own root.
func TestHostPathRootsRecorded(t *testing.T) {
	a := Admitter{NodeName: node, MQTTPolicy: Policy{AllowedHostPaths: []string{"/data/inner", "/data", "/var/log/app"}}}
	forged := func(p *v1.Pod) { p.Annotations = map[string]string{AnnotationHostPathRoots: `{"d":"/"}`} }
	pod := policyPod(func(p *v1.Pod) {
		forged(p)
		p.Spec.Volumes = []v1.Volume{hostPathVolume("d", "/data/inner/x"), hostPathVolume("l", "/var/log/app/"),
			{Name: "e", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	})
	got, err := a.Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.MQTT, Origin: "t"}})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := HostPathRoots(got)
	if err != nil || len(roots) != 2 || roots["d"] != "/data" || roots["l"] != "/var/log/app" {
		t.Errorf("roots %v, %v; want d under /data (the outermost), l under /var/log/app", roots, err)
	}
	if pod.Annotations[AnnotationHostPathRoots] != `{"d":"/"}` {
		t.Errorf("Admit modified the item's pod")
	}
	for _, k := range []source.Kind{source.File, source.MQTT} {
		got, err := a.Admit(source.Item{Pod: policyPod(forged), Ref: source.Ref{Kind: k, Origin: "t"}})
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := got.Annotations[AnnotationHostPathRoots]; ok {
			t.Errorf("%s pod kept a forged %s: %q", k, AnnotationHostPathRoots, v)
		}
	}
	if _, err := HostPathRoots(&v1.Pod{}); err != nil {
		t.Errorf("no annotation: %v", err)
	}
}
