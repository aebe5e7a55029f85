package ctrspec

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// The cgroup mount and namespace as CRI builds them: read-only, a private cgroup namespace only on
// v2 and not privileged, the host's nsdelegate kept only in the host's namespace, and a
// volumeMount at /sys/fs/cgroup left alone.
func TestCgroupFSOpts(t *testing.T) {
	host := []string{"nsdelegate", "memory_recursiveprot"}
	base := []string{"nosuid", "noexec", "nodev", "relatime", "ro"}
	for _, tt := range []struct {
		name        string
		v2, priv    bool
		wantNS      bool
		wantOptions []string
	}{
		{"v1", false, false, false, append(base, host...)},
		{"v1 privileged", false, true, false, append(base, host...)},
		{"v2", true, false, true, base},
		{"v2 privileged", true, true, false, append(base, host...)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := applyOpts(t, CgroupFSOpts(&v1.Container{Name: "app"}, tt.priv, CgroupFeatures{V2: tt.v2, HostMountOptions: host}))
			var got []specs.Mount
			for _, m := range s.Mounts {
				if m.Destination == "/sys/fs/cgroup" {
					got = append(got, m)
				}
			}
			if len(got) != 1 || got[0].Type != "cgroup" || got[0].Source != "cgroup" || !slices.Equal(got[0].Options, tt.wantOptions) {
				t.Errorf("/sys/fs/cgroup mounts = %+v, want one cgroup mount with %v", got, tt.wantOptions)
			}
			hasNS := s.Linux != nil && slices.ContainsFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.CgroupNamespace && n.Path == "" })
			if hasNS != tt.wantNS {
				t.Errorf("private cgroup namespace = %v, want %v", hasNS, tt.wantNS)
			}
		})
	}
	c := &v1.Container{Name: "app", VolumeMounts: []v1.VolumeMount{{Name: "cg", MountPath: "/sys/fs/cgroup/"}}}
	if opts := CgroupFSOpts(c, false, CgroupFeatures{V2: true}); len(opts) != 0 {
		t.Errorf("a volumeMount at /sys/fs/cgroup still gets %d cgroup options", len(opts))
	}
}
