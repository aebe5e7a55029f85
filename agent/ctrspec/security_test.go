package ctrspec

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func mustSecurityOpts(t *testing.T, pod *v1.Pod, c *v1.Container) []oci.SpecOpts {
	t.Helper()
	opts, err := SecurityOpts(pod, c, SecurityInputs{SeccompRoot: t.TempDir()})
	if err != nil {
		t.Fatalf("SecurityOpts: %v", err)
	}
	return opts
}

// specIn applies opts to a spec whose rootfs is root (with the image's /etc files).
func specIn(t *testing.T, root string, opts []oci.SpecOpts) (*oci.Spec, error) {
	t.Helper()
	s := &oci.Spec{
		Root:    &specs.Root{Path: root},
		Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: []string{"CAP_CHOWN", "CAP_NET_RAW"}, Effective: []string{"CAP_CHOWN", "CAP_NET_RAW"}, Permitted: []string{"CAP_CHOWN", "CAP_NET_RAW"}}},
		Linux:   &specs.Linux{Resources: &specs.LinuxResources{}},
	}
	for _, opt := range opts {
		if err := opt(context.Background(), nil, &containers.Container{}, s); err != nil {
			return s, err
		}
	}
	return s, nil
}

func secPod(psc *v1.PodSecurityContext) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u-1"}, Spec: v1.PodSpec{SecurityContext: psc}}
}

// kubelet's verifyRunAsNonRoot, case by case, with its messages.
func TestCheckRunAsNonRoot(t *testing.T) {
	yes := ptr(true)
	tests := []struct {
		name      string
		pod       *v1.PodSecurityContext
		ctr       *v1.SecurityContext
		imageUser string
		want      string // substring of the error; "" for none
	}{
		{name: "not asked", imageUser: ""},
		{name: "root image", pod: &v1.PodSecurityContext{RunAsNonRoot: yes}, imageUser: "", want: "container has runAsNonRoot and image will run as root"},
		{name: "uid 0 image", ctr: &v1.SecurityContext{RunAsNonRoot: yes}, imageUser: "0:0", want: "image will run as root"},
		{name: "numeric non-root image", pod: &v1.PodSecurityContext{RunAsNonRoot: yes}, imageUser: "1000"},
		{name: "numeric with group", pod: &v1.PodSecurityContext{RunAsNonRoot: yes}, imageUser: "1000:1000"},
		{name: "named image user cannot be verified", pod: &v1.PodSecurityContext{RunAsNonRoot: yes}, imageUser: "nobody",
			want: "image has non-numeric user (nobody), cannot verify user is non-root"},
		{name: "named image user with runAsUser", pod: &v1.PodSecurityContext{RunAsNonRoot: yes, RunAsUser: ptr[int64](65534)}, imageUser: "nobody"},
		{name: "runAsUser 0", ctr: &v1.SecurityContext{RunAsNonRoot: yes, RunAsUser: ptr[int64](0)}, imageUser: "1000",
			want: "container's runAsUser breaks non-root policy"},
		{name: "container turns it off", pod: &v1.PodSecurityContext{RunAsNonRoot: yes}, ctr: &v1.SecurityContext{RunAsNonRoot: ptr(false)}},
		{name: "container runAsUser overrides pod's 0", pod: &v1.PodSecurityContext{RunAsNonRoot: yes, RunAsUser: ptr[int64](0)},
			ctr: &v1.SecurityContext{RunAsUser: ptr[int64](1000)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := secPod(tt.pod)
			c := &v1.Container{Name: "app", SecurityContext: tt.ctr}
			_, err := SecurityOpts(pod, c, SecurityInputs{ImageUser: tt.imageUser})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("err = %v, want none", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want a ConfigError containing %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), `(pod: "web_default(u-1)", container: app)`) {
				t.Errorf("err = %v, want kubelet's pod and container reference", err)
			}
		})
	}
}

// imageRoot writes an image's /etc/passwd and /etc/group.
func imageRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\napp:x:1000:\nextra:x:2000:app\nother:x:3000:root\n"), 0o644)
	return root
}

func TestUserAndGroups(t *testing.T) {
	strict := v1.SupplementalGroupsPolicyStrict
	tests := []struct {
		name      string
		pod       *v1.PodSecurityContext
		ctr       *v1.SecurityContext
		imageUser string
		uid, gid  uint32
		groups    []uint32
	}{
		{name: "runAsUser resolves the group and memberships from the image", pod: &v1.PodSecurityContext{RunAsUser: ptr[int64](1000)},
			uid: 1000, gid: 1000, groups: []uint32{1000, 2000}},
		{name: "supplementalGroups and fsGroup are added (Merge)", pod: &v1.PodSecurityContext{RunAsUser: ptr[int64](1000), SupplementalGroups: []int64{5000}, FSGroup: ptr[int64](6000)},
			uid: 1000, gid: 1000, groups: []uint32{1000, 2000, 5000, 6000}},
		{name: "Strict leaves out the image's memberships", pod: &v1.PodSecurityContext{RunAsUser: ptr[int64](1000), SupplementalGroups: []int64{5000}, SupplementalGroupsPolicy: &strict},
			uid: 1000, gid: 1000, groups: []uint32{1000, 5000}},
		{name: "runAsGroup replaces the primary group", pod: &v1.PodSecurityContext{RunAsUser: ptr[int64](1000)}, ctr: &v1.SecurityContext{RunAsGroup: ptr[int64](4000)},
			uid: 1000, gid: 4000, groups: []uint32{2000, 4000}},
		{name: "named image user with fsGroup", pod: &v1.PodSecurityContext{FSGroup: ptr[int64](6000)}, imageUser: "app",
			uid: 1000, gid: 1000, groups: []uint32{1000, 2000, 6000}},
		{name: "image uid:gid keeps its gid", pod: &v1.PodSecurityContext{SupplementalGroups: []int64{7}}, imageUser: "1000:1234",
			uid: 1000, gid: 1234, groups: []uint32{7, 1234, 2000}},
		{name: "runAsGroup alone on a root image", ctr: &v1.SecurityContext{RunAsGroup: ptr[int64](4000)},
			uid: 0, gid: 4000, groups: []uint32{3000, 4000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := SecurityOpts(secPod(tt.pod), &v1.Container{Name: "app", SecurityContext: tt.ctr}, SecurityInputs{ImageUser: tt.imageUser})
			if err != nil {
				t.Fatal(err)
			}
			s, err := specIn(t, imageRoot(t), opts)
			if err != nil {
				t.Fatal(err)
			}
			u := s.Process.User
			if u.UID != tt.uid || u.GID != tt.gid || !slices.Equal(u.AdditionalGids, tt.groups) {
				t.Errorf("user = %d:%d groups %v, want %d:%d groups %v", u.UID, u.GID, u.AdditionalGids, tt.uid, tt.gid, tt.groups)
			}
		})
	}
}

func TestEffectiveSecurityPrecedence(t *testing.T) {
	pod := secPod(&v1.PodSecurityContext{RunAsUser: ptr[int64](1), RunAsGroup: ptr[int64](2), RunAsNonRoot: ptr(true),
		SELinuxOptions: &v1.SELinuxOptions{Level: "s0"}})
	c := &v1.Container{SecurityContext: &v1.SecurityContext{RunAsGroup: ptr[int64](20), RunAsNonRoot: ptr(false), Privileged: ptr(true)}}
	sc := effectiveSecurity(pod, c)
	if *sc.RunAsUser != 1 || *sc.RunAsGroup != 20 || *sc.RunAsNonRoot || !*sc.Privileged || sc.SELinuxOptions.Level != "s0" {
		t.Errorf("effective = user %d group %d nonroot %v privileged %v selinux %v; want the pod's user and SELinux, the container's group, nonroot and privileged",
			*sc.RunAsUser, *sc.RunAsGroup, *sc.RunAsNonRoot, *sc.Privileged, sc.SELinuxOptions)
	}
}

func TestSeccomp(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "audit.json"), []byte(`{"defaultAction":"SCMP_ACT_LOG"}`), 0o644)
	os.WriteFile(filepath.Join(root, "bad.json"), []byte(`{"syscalls":[]}`), 0o644)
	outside := filepath.Join(t.TempDir(), "outside.json")
	os.WriteFile(outside, []byte(`{"defaultAction":"SCMP_ACT_ALLOW"}`), 0o644)
	os.Symlink(outside, filepath.Join(root, "escape.json"))
	prof := func(typ v1.SeccompProfileType, local string) *v1.SeccompProfile {
		p := &v1.SeccompProfile{Type: typ}
		if local != "" {
			p.LocalhostProfile = &local
		}
		return p
	}
	tests := []struct {
		name    string
		pod     *v1.SeccompProfile
		ctr     *v1.SecurityContext
		action  specs.LinuxSeccompAction // "" for no filter
		wantErr string
	}{
		{name: "default is unconfined"},
		{name: "pod RuntimeDefault", pod: prof(v1.SeccompProfileTypeRuntimeDefault, ""), action: specs.ActErrno},
		{name: "container Unconfined overrides pod", pod: prof(v1.SeccompProfileTypeRuntimeDefault, ""), ctr: &v1.SecurityContext{SeccompProfile: prof(v1.SeccompProfileTypeUnconfined, "")}},
		{name: "privileged gets none", pod: prof(v1.SeccompProfileTypeRuntimeDefault, ""), ctr: &v1.SecurityContext{Privileged: ptr(true)}},
		{name: "Localhost file", ctr: &v1.SecurityContext{SeccompProfile: prof(v1.SeccompProfileTypeLocalhost, "audit.json")}, action: specs.ActLog},
		{name: "Localhost missing", ctr: &v1.SecurityContext{SeccompProfile: prof(v1.SeccompProfileTypeLocalhost, "nope.json")}, wantErr: "nope.json"},
		{name: "Localhost not a profile", ctr: &v1.SecurityContext{SeccompProfile: prof(v1.SeccompProfileTypeLocalhost, "bad.json")}, wantErr: "no defaultAction"},
		{name: "Localhost climbing out", ctr: &v1.SecurityContext{SeccompProfile: prof(v1.SeccompProfileTypeLocalhost, "../x.json")}, wantErr: "without '..'"},
		{name: "Localhost symlink out stays inside", ctr: &v1.SecurityContext{SeccompProfile: prof(v1.SeccompProfileTypeLocalhost, "escape.json")}, wantErr: "escape.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := secPod(&v1.PodSecurityContext{SeccompProfile: tt.pod})
			opts, err := SecurityOpts(pod, &v1.Container{Name: "app", SecurityContext: tt.ctr}, SecurityInputs{SeccompRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			s, err := specIn(t, t.TempDir(), opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.action == "" && s.Linux.Seccomp != nil:
				t.Errorf("seccomp filter %s set, want none", s.Linux.Seccomp.DefaultAction)
			case tt.action != "" && (s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != tt.action):
				t.Errorf("seccomp = %+v, want default action %s", s.Linux.Seccomp, tt.action)
			}
		})
	}
}

func TestProcMountAndPrivileged(t *testing.T) {
	s, _ := specIn(t, t.TempDir(), mustSecurityOpts(t, secPod(nil), &v1.Container{Name: "app"}))
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("default procMount: masked %v readonly %v, want kubelet's lists", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	um := v1.UnmaskedProcMount
	s, _ = specIn(t, t.TempDir(), mustSecurityOpts(t, secPod(nil), &v1.Container{Name: "app", SecurityContext: &v1.SecurityContext{ProcMount: &um}}))
	if len(s.Linux.MaskedPaths)+len(s.Linux.ReadonlyPaths) != 0 {
		t.Errorf("Unmasked: masked %v readonly %v, want none", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	// Privileged: all capabilities even when some are dropped (CRI), nothing masked.
	sc := &v1.SecurityContext{Privileged: ptr(true), Capabilities: &v1.Capabilities{Drop: []v1.Capability{"CHOWN"}}}
	s, err := specIn(t, t.TempDir(), mustSecurityOpts(t, secPod(nil), &v1.Container{Name: "app", SecurityContext: sc}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Capabilities.Effective, "CAP_CHOWN") || !slices.Contains(s.Process.Capabilities.Effective, "CAP_SYS_ADMIN") {
		t.Errorf("privileged: effective %v, want every capability", s.Process.Capabilities.Effective)
	}
	if len(s.Linux.MaskedPaths) != 0 {
		t.Errorf("privileged: masked %v, want none", s.Linux.MaskedPaths)
	}
}

func TestSysctlOpt(t *testing.T) {
	pod := secPod(&v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "net.ipv4.ip_local_port_range", Value: "1024 2048"}, {Name: "net/ipv4/conf/eth0.100/forwarding", Value: "1"}}})
	s, err := specIn(t, t.TempDir(), mustSecurityOpts(t, pod, &v1.Container{Name: "app"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"net.ipv4.ip_local_port_range": "1024 2048", "net.ipv4.conf.eth0/100.forwarding": "1"}
	if len(s.Linux.Sysctl) != 2 || s.Linux.Sysctl["net.ipv4.ip_local_port_range"] != want["net.ipv4.ip_local_port_range"] || s.Linux.Sysctl["net.ipv4.conf.eth0/100.forwarding"] != "1" {
		t.Errorf("sysctls = %v, want %v", s.Linux.Sysctl, want)
	}
}
