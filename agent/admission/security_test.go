package admission

import (
	"errors"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/sysctl"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func secPod(mod func(*v1.Pod)) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "busybox:1"}}}}
	mod(p)
	return p
}

func bptr(b bool) *bool     { return &b }
func iptr(i int64) *int64   { return &i }
func sptr(s string) *string { return &s }

func TestSecurityAdmission(t *testing.T) {
	unmasked := v1.UnmaskedProcMount
	badPolicy := v1.PodFSGroupChangePolicy("Sometimes")
	allow, err := sysctl.NewAllowlist(append(sysctl.Safe("6.1"), "net.core.*"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		mod  func(*v1.Pod)
		want []string // substrings of the refusal; none: admitted
	}{
		{name: "plain pod", mod: func(*v1.Pod) {}},
		{name: "safe sysctl", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "net.ipv4.ip_local_port_range", Value: "1024 65000"}}}
		}},
		{name: "allowed unsafe sysctl", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}}}
		}},
		{name: "unsafe sysctl", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}}}
		}, want: []string{"spec.securityContext.sysctls[0].name", "forbidden sysctl", `"net.ipv4.ip_forward"`}},
		{name: "node-wide sysctl", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "vm.swappiness", Value: "1"}}}
		}, want: []string{`"vm.swappiness" is not a namespaced sysctl`}},
		{name: "net sysctl with hostNetwork", mod: func(p *v1.Pod) {
			p.Spec.HostNetwork = true
			p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "net.ipv4.tcp_syncookies", Value: "1"}}}
		}, want: []string{"not allowed with hostNetwork"}},
		{name: "duplicate and malformed sysctls", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{
				{Name: "net.ipv4.tcp_syncookies", Value: "1"}, {Name: "net/ipv4/tcp_syncookies", Value: "0"}, {Name: "Net.X", Value: "1"}}}
		}, want: []string{"sysctls[1].name: Duplicate", "sysctls[2].name: Invalid"}},
		{name: "hostUsers false", mod: func(p *v1.Pod) { p.Spec.HostUsers = bptr(false) },
			want: []string{"spec.hostUsers", "user namespaces"}},
		{name: "procMount Unmasked", mod: func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{ProcMount: &unmasked}
		}, want: []string{"spec.containers[0].securityContext.procMount", "`hostUsers` must be false"}},
		{name: "no escalation but privileged", mod: func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{AllowPrivilegeEscalation: bptr(false), Privileged: bptr(true)}
		}, want: []string{"cannot set `allowPrivilegeEscalation` to false and `privileged` to true"}},
		{name: "no escalation but SYS_ADMIN", mod: func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox:1", SecurityContext: &v1.SecurityContext{
				AllowPrivilegeEscalation: bptr(false), Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_ADMIN"}}}}}
		}, want: []string{"spec.initContainers[0].securityContext", "CAP_SYS_ADMIN"}},
		{name: "ids out of range", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: iptr(-1), FSGroup: iptr(1 << 40), SupplementalGroups: []int64{5, -2}}
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{RunAsGroup: iptr(-5)}
		}, want: []string{"spec.securityContext.runAsUser", "spec.securityContext.fsGroup", "spec.securityContext.supplementalGroups[1]",
			"spec.containers[0].securityContext.runAsGroup"}},
		{name: "fsGroupChangePolicy", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{FSGroupChangePolicy: &badPolicy}
		}, want: []string{"spec.securityContext.fsGroupChangePolicy", "OnRootMismatch"}},
		{name: "seccomp Localhost without a profile", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost}}
		}, want: []string{"spec.securityContext.seccompProfile.localhostProfile: Required"}},
		{name: "seccomp Localhost climbing out", mod: func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: sptr("../../etc/x.json")}}
		}, want: []string{"spec.containers[0].securityContext.seccompProfile.localhostProfile", "without '..'"}},
		{name: "seccomp localhostProfile with RuntimeDefault", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault, LocalhostProfile: sptr("a.json")}}
		}, want: []string{"can only be set when seccomp type is Localhost"}},
		{name: "seccomp good", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}}
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: sptr("profiles/audit.json")}}
		}},
		{name: "AppArmor RuntimeDefault", mod: func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}}
		}, want: []string{"spec.containers[0].securityContext.appArmorProfile.type", "mqlet does not apply AppArmor"}},
		{name: "AppArmor annotation", mod: func(p *v1.Pod) {
			p.Annotations = map[string]string{appArmorAnnotationPrefix + "app": "runtime/default"}
		}, want: []string{"metadata.annotations[container.apparmor.security.beta.kubernetes.io/app]"}},
		{name: "AppArmor Unconfined", mod: func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := secPod(tt.mod)
			for _, kind := range []source.Kind{source.File, source.MQTT} {
				_, err := Admitter{NodeName: "n", Sysctls: allow, MQTTPolicy: Policy{AllowHostNamespaces: true}}.Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: kind}})
				if len(tt.want) == 0 {
					if err != nil {
						t.Fatalf("%s pod refused: %v", kind, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("%s pod admitted, want a refusal mentioning %q", kind, tt.want)
				}
				var pe *PolicyError
				if errors.As(err, &pe) {
					t.Fatalf("%s pod refused by the policy, want a validation error: %v", kind, err)
				}
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s pod: refusal %q does not mention %q", kind, err, w)
					}
				}
			}
		})
	}
}

// Without a node allowlist, only the safe set passes.
func TestSysctlsDefaultToSafeSet(t *testing.T) {
	pod := secPod(func(p *v1.Pod) {
		p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}}}
	})
	if _, err := (Admitter{NodeName: "n"}).Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.File}}); err == nil || !strings.Contains(err.Error(), "net.core.somaxconn") {
		t.Errorf("unsafe sysctl with no allowlist: err = %v, want a refusal naming it", err)
	}
	pod.Spec.SecurityContext.Sysctls[0].Name = "kernel.shm_rmid_forced"
	if _, err := (Admitter{NodeName: "n"}).Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.File}}); err != nil {
		t.Errorf("safe sysctl refused: %v", err)
	}
}

func TestSecurityWarnings(t *testing.T) {
	pod := secPod(func(p *v1.Pod) {
		p.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: "s0:c1"}}
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{WindowsOptions: &v1.WindowsSecurityContextOptions{}}
	})
	w := SecurityWarnings(pod)
	if len(w) != 2 || !strings.HasPrefix(w[0], "spec.securityContext.seLinuxOptions: ignored") ||
		!strings.HasPrefix(w[1], "spec.containers[0].securityContext.windowsOptions: ignored") {
		t.Errorf("warnings = %q", w)
	}
	if _, err := (Admitter{NodeName: "n"}).Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.File}}); err != nil {
		t.Errorf("pod with ignored fields refused: %v", err)
	}
}
