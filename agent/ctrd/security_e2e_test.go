package ctrd_test

// Security context on real containers: what the process inside sees (/proc/self/status, id,
// stat), not what the spec says.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

func bptr(b bool) *bool     { return &b }
func iptr(i int64) *int64   { return &i }
func sptr(s string) *string { return &s }

// run starts the pod's only container and waits for it to log want.
func (g *rig) run(p *v1.Pod, want ...string) ctrd.Container {
	g.t.Helper()
	sb := g.sandbox(p)
	c := g.start(p, sb, &p.Spec.Containers[0])
	for _, w := range want {
		g.waitLog(c, w)
	}
	return c
}

// status is a shell line that prints the /proc/self/status fields the tests read.
const status = `grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; echo status-done; `

// runAsUser, runAsGroup, supplementalGroups and fsGroup: the process's ids, and the group of an
// emptyDir (setgid, so files made there get the group too).
func TestSecurityIDsAndFSGroup(t *testing.T) {
	g := newRig(t)
	c := shell("c", `echo uid=$(id -u) gid=$(id -g) groups="$(id -G)"; touch /vol/f; echo vol=$(stat -c '%g %A' /vol) file=$(stat -c %g /vol/f); sleep 3600`)
	c.VolumeMounts = []v1.VolumeMount{{Name: "vol", MountPath: "/vol"}}
	p := newPod("5ec00001-ids", c)
	p.Spec.Volumes = []v1.Volume{{Name: "vol", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: iptr(1000), RunAsGroup: iptr(3000), SupplementalGroups: []int64{4000}, FSGroup: iptr(5000)}
	g.run(p, "uid=1000 gid=3000 groups=3000 4000 5000", "vol=5000 drwxrwsrwx file=5000")
}

// A container's runAsUser wins over the pod's; without runAsGroup the group is the image's
// /etc/passwd entry for the uid (nobody: 65534).
func TestSecurityContainerOverridesPod(t *testing.T) {
	g := newRig(t)
	c := shell("c", `echo uid=$(id -u) gid=$(id -g); sleep 3600`)
	c.SecurityContext = &v1.SecurityContext{RunAsUser: iptr(65534)}
	p := newPod("5ec00002-ovr", c)
	p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: iptr(1000)}
	g.run(p, "uid=65534 gid=65534")
}

func TestSecurityReadOnlyRootFilesystem(t *testing.T) {
	for _, ro := range []bool{true, false} {
		t.Run(fmt.Sprint("readOnly=", ro), func(t *testing.T) {
			g := newRig(t)
			c := shell("c", `if touch /x 2>/dev/null; then echo root-writable; else echo root-read-only; fi; sleep 3600`)
			c.SecurityContext = &v1.SecurityContext{ReadOnlyRootFilesystem: bptr(ro)}
			want := "root-writable"
			if ro {
				want = "root-read-only"
			}
			g.run(newPod(fmt.Sprintf("5ec0000%d-ro", map[bool]int{true: 3, false: 4}[ro]), c), want)
		})
	}
}

// Capabilities on containerd's default set, drop ALL + add, and no_new_privs, as the kernel shows
// them to the process.
func TestSecurityCapabilitiesAndNoNewPrivs(t *testing.T) {
	// containerd's default set: CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP
	// NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP.
	const defaultSet = "CapEff:\t00000000a80425fb"
	tests := []struct {
		name string
		sc   *v1.SecurityContext
		want []string
	}{
		{name: "default", want: []string{defaultSet, "NoNewPrivs:\t0"}},
		{name: "drop ALL add NET_BIND_SERVICE, no escalation", sc: &v1.SecurityContext{
			Capabilities:             &v1.Capabilities{Drop: []v1.Capability{"ALL"}, Add: []v1.Capability{"NET_BIND_SERVICE"}},
			AllowPrivilegeEscalation: bptr(false)},
			want: []string{"CapEff:\t0000000000000400", "NoNewPrivs:\t1"}},
		{name: "add NET_ADMIN drop NET_RAW", sc: &v1.SecurityContext{
			Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_ADMIN"}, Drop: []v1.Capability{"NET_RAW"}}},
			want: []string{"CapEff:\t00000000a80415fb"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newRig(t)
			c := shell("c", status+"sleep 3600")
			c.SecurityContext = tt.sc
			g.run(newPod(fmt.Sprintf("5ec0001%d-cap", i), c), append(tt.want, "status-done")...)
		})
	}
}

// Privileged: every capability this agent has, whatever the drop list says (CRI), no seccomp, an
// unmasked /proc; an ordinary container has /proc/timer_list masked (kubelet's default masked
// paths: /dev/null is mounted over it).
func TestSecurityPrivileged(t *testing.T) {
	g := newRig(t)
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var hostCaps string
	for _, l := range strings.Split(string(self), "\n") {
		if strings.HasPrefix(l, "CapEff:") {
			hostCaps = l
		}
	}
	script := status + `echo timer_list=$(head -c 10 /proc/timer_list | wc -c); sleep 3600`
	c := shell("c", script)
	c.SecurityContext = &v1.SecurityContext{Privileged: bptr(true), Capabilities: &v1.Capabilities{Drop: []v1.Capability{"NET_RAW"}}}
	ctr := g.run(newPod("5ec00020-priv", c), hostCaps, "Seccomp:\t0", "status-done", "timer_list=")
	if b, _ := os.ReadFile(ctr.LogPath); !strings.Contains(string(b), "timer_list=10\n") {
		t.Errorf("privileged container has /proc/timer_list masked:\n%s", b)
	}
	g.run(newPod("5ec00021-priv", shell("c", script)), "timer_list=0\n")
}

// seccomp: RuntimeDefault filters (mode 2), Unconfined and the default do not (0), a Localhost
// profile from <state>/seccomp is loaded and enforced.
func TestSecuritySeccomp(t *testing.T) {
	g := newRig(t)
	dir := filepath.Join(g.state, ctrspec.SeccompDir)
	os.MkdirAll(filepath.Join(dir, "profiles"), 0o755)
	// Everything allowed but mkdir/mkdirat, which fail with EPERM.
	prof := `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}`
	if err := os.WriteFile(filepath.Join(dir, "profiles", "no-mkdir.json"), []byte(prof), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		pod  *v1.SeccompProfile
		ctr  *v1.SeccompProfile
		want []string
	}{
		{name: "unset", want: []string{"Seccomp:\t0", "mkdir-ok"}},
		{name: "pod RuntimeDefault", pod: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}, want: []string{"Seccomp:\t2", "mkdir-ok"}},
		{name: "container Unconfined over pod RuntimeDefault", pod: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault},
			ctr: &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined}, want: []string{"Seccomp:\t0"}},
		{name: "Localhost", ctr: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: sptr("profiles/no-mkdir.json")},
			want: []string{"Seccomp:\t2", "mkdir-refused"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := shell("c", status+`if mkdir /tmp/d 2>/dev/null; then echo mkdir-ok; else echo mkdir-refused; fi; sleep 3600`)
			c.SecurityContext = &v1.SecurityContext{SeccompProfile: tt.ctr}
			p := newPod(fmt.Sprintf("5ec0003%d-sec", i), c)
			p.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: tt.pod}
			g.run(p, append(tt.want, "status-done")...)
		})
	}
	// A profile that is not there: the container is not created (kubelet's CreateContainerError).
	c := shell("c", "sleep 3600")
	c.SecurityContext = &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: sptr("missing.json")}}
	p := newPod("5ec00039-sec", c)
	_, err := g.r.StartContainer(context.Background(), p, g.sandbox(p), &p.Spec.Containers[0], 0)
	var se *ctrd.StartError
	if !errors.As(err, &se) || se.Reason != "CreateContainerError" || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("missing Localhost profile: err = %v, want a CreateContainerError naming missing.json", err)
	}
}

// Sysctls land in the pod's namespaces: a network one and an IPC one, read back inside.
func TestSecuritySysctls(t *testing.T) {
	g := newRig(t)
	c := shell("c", `echo range=$(cat /proc/sys/net/ipv4/ip_local_port_range) rmid=$(cat /proc/sys/kernel/shm_rmid_forced); sleep 3600`)
	p := newPod("5ec00040-sys", c)
	p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{
		{Name: "net.ipv4.ip_local_port_range", Value: "40000 40100"}, {Name: "kernel/shm_rmid_forced", Value: "1"}}}
	g.run(p, "range=40000 40100 rmid=1")
	host, _ := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if strings.Fields(string(host))[0] == "40000" {
		t.Errorf("the host's ip_local_port_range changed to %q: the sysctl was not confined to the pod", host)
	}
}

// runAsNonRoot is checked against the image's user, as kubelet does: a root image is refused with
// CreateContainerConfigError; a numeric non-root user passes; a named one cannot be verified and
// is refused unless runAsUser is set.
func TestSecurityRunAsNonRoot(t *testing.T) {
	g := newRig(t)
	env := testenv.Require(t)
	dir := t.TempDir()
	for ref, user := range map[string]string{"mqlet.test/numeric:1": "1000:1000", "mqlet.test/named:1": "nobody"} {
		path, err := testenv.ArchiveWithUser(env.Image(testenv.Busybox), dir, ref, user)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.r.ImportArchiveIfMissing(context.Background(), path); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, image string
		runAsUser   *int64
		want        string // log line, or the refusal when refused is set
		refused     bool
	}{
		{name: "root image", image: testenv.BusyboxRef, refused: true, want: "container has runAsNonRoot and image will run as root"},
		{name: "numeric image user", image: "mqlet.test/numeric:1", want: "uid=1000 gid=1000"},
		{name: "named image user", image: "mqlet.test/named:1", refused: true,
			want: "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root"},
		{name: "named image user with runAsUser", image: "mqlet.test/named:1", runAsUser: iptr(4242), want: "uid=4242 gid=0"},
		{name: "runAsUser 0", image: "mqlet.test/numeric:1", runAsUser: iptr(0), refused: true, want: "container's runAsUser breaks non-root policy"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := shell("c", `echo uid=$(id -u) gid=$(id -g); sleep 3600`)
			c.SecurityContext = &v1.SecurityContext{RunAsNonRoot: bptr(true), RunAsUser: tt.runAsUser}
			p := newPod(fmt.Sprintf("5ec0005%d-nonroot", i), c)
			p.Spec.Containers[0].Image = tt.image
			if !tt.refused {
				g.run(p, tt.want)
				return
			}
			_, err := g.r.StartContainer(context.Background(), p, g.sandbox(p), &p.Spec.Containers[0], 0)
			var se *ctrd.StartError
			if !errors.As(err, &se) || se.Reason != "CreateContainerConfigError" || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want a CreateContainerConfigError with %q", err, tt.want)
			}
		})
	}
	// Without runAsNonRoot, the named user is resolved from the image's /etc/passwd.
	c := shell("c", `echo uid=$(id -u) gid=$(id -g); sleep 3600`)
	p := newPod("5ec0005f-named", c)
	p.Spec.Containers[0].Image = "mqlet.test/named:1"
	g.run(p, "uid=65534 gid=65534")
}
