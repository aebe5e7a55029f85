package ctrd_test

// The cgroup file system inside real containers, as containerd's CRI mounts it: the container's
// own limits readable at /sys/fs/cgroup, read-only unless privileged.

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// cgroupScript prints the container's memory limit as the cgroup file system inside shows it,
// whether it can write it back, and (v2) the container's cgroup as its namespace names it.
const cgroupScript = `f=/sys/fs/cgroup/memory.max; [ -e $f ] || f=/sys/fs/cgroup/memory/memory.limit_in_bytes
v=$(cat $f); echo limit=$v
if (echo $v > $f) 2>/dev/null; then echo cgroup-writable; else echo cgroup-read-only; fi
echo cgroup=$(grep '^0::' /proc/self/cgroup); sleep 3600`

func TestCgroupFSInContainer(t *testing.T) {
	var st unix.Statfs_t
	v2 := unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	for i, tt := range []struct {
		name             string
		privileged, host bool
		want             string
	}{
		{"plain", false, false, "cgroup-read-only"},
		{"hostNetwork+hostPID", false, true, "cgroup-read-only"},
		{"privileged", true, false, "cgroup-writable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := newRig(t)
			c := shell("c", cgroupScript)
			c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
			if tt.privileged {
				c.SecurityContext = &v1.SecurityContext{Privileged: bptr(true)}
			}
			p := newPod(fmt.Sprintf("c9f5000%d-cgfs", i), c)
			p.Spec.HostNetwork, p.Spec.HostPID = tt.host, tt.host
			want := []string{"limit=67108864\n", tt.want + "\n"}
			if v2 && !tt.privileged {
				// A private cgroup namespace: the container's cgroup is its root.
				want = append(want, "cgroup=0::/\n")
			}
			g.run(p, want...)
		})
	}
}
