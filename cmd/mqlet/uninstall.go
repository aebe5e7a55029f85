package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/cgroup/delegate"
	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/shutdown"
	"github.com/mqlet/mqlet/internal/startbackoff"
	"golang.org/x/sys/unix"
)

// UninstallCmd is `mqlet uninstall`: what the .deb's purge runs (packaging/postrm) and what a
// tarball install is removed with. Without --purge it only lists what --purge would remove.
type UninstallCmd struct {
	config.Flags `embed:""`

	Purge    bool          `help:"Stop and remove mqlet's pods and remove everything mqlet made on this host (see the command's help). Without it, list what would go."`
	MaxGrace time.Duration `name:"max-grace" default:"10s" help:"Longest grace period a pod's containers get before SIGKILL (their own terminationGracePeriodSeconds when shorter)."`
}

// Help lists what goes, and what stays.
func (UninstallCmd) Help() string {
	return `With --purge, with the agent stopped: every container of mqlet's containerd namespace (stopped
with its grace period, at most --max-grace), the pods' network attachments (CNI DEL), namespaces,
cgroups, volumes and logs, every image and lease of the namespace and the namespace itself, the
cgroups below cgroupRoot, the default CNI network file (10-mqlet.conflist, only when it is
mqlet's), the mqlet0 bridge and the iptables rules that name the network, the node key
(secretKeyFile), the logind drop-in mqlet wrote, the state dir and the API socket.
Kept: the config file, the manifest dir and your manifests, the binary and the unit (the package
manager's), containerd and its other namespaces, CNI plugins, other networks' files and rules.`
}

// Run removes (with --purge) or lists what mqlet made on this host.
func (c *UninstallCmd) Run(env *ctlEnv) error {
	cfg, err := config.Load(c.Flags, os.Environ())
	if err != nil {
		return err
	}
	u := uninstaller{cfg: cfg, configFile: c.Flags.Config, out: env.out, log: slog.New(slog.NewTextHandler(env.errOut, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if !c.Purge {
		u.plan()
		return nil
	}
	ctx, stop := env.context()
	defer stop()
	return u.purge(ctx, c.MaxGrace)
}

type uninstaller struct {
	cfg        config.Config
	configFile string // --config, kept
	out        io.Writer
	log        *slog.Logger
}

// kept names the config file, which a purge keeps (the package manager removes its own copy).
func (u *uninstaller) kept() string {
	if u.configFile == "" {
		return "the config file"
	}
	return u.configFile
}

func (u *uninstaller) say(format string, args ...any) { fmt.Fprintf(u.out, format+"\n", args...) }

func (u *uninstaller) defaultNetwork() cni.DefaultNetwork {
	return cni.DefaultNetwork{Name: cni.DefaultNetworkName, Bridge: cni.DefaultBridge}
}

// plan prints what purge would remove, changing nothing.
func (u *uninstaller) plan() {
	u.say("mqlet uninstall --purge would remove (nothing is changed without --purge):")
	u.say("  containerd %s, namespace %s: every container (pods stopped), image and lease, then the namespace", u.cfg.ContainerdAddress, u.cfg.ContainerdNamespace)
	u.say("  pod networks (CNI DEL), pod namespaces, volumes and logs of every pod")
	u.say("  cgroups below %s (and below %s's cgroup), and that systemd scope when no other agent's pods are in it", filepath.Join(u.cfg.CgroupRoot, u.cfg.ContainerdNamespace), delegate.Unit)
	u.say("  %s (if it is mqlet's default network)", filepath.Join(u.cfg.CNIConfDir, cni.DefaultConfFile))
	u.say("  the bridge %s and the iptables rules naming the network %q", cni.DefaultBridge, cni.DefaultNetworkName)
	for _, p := range []string{u.cfg.SecretKeyFile, filepath.Join(shutdown.DefaultLogindConfDir, shutdown.LogindDropIn), u.cfg.StateDir, u.cfg.APISocket, startbackoff.Path(os.Getenv)} {
		if _, err := os.Lstat(p); err == nil {
			u.say("  %s", p)
		}
	}
	u.say("kept: %s, %s and the manifests in it, the binary and the unit", u.kept(), u.cfg.ManifestDir)
}

// purge removes everything mqlet made, each part tried even when another failed; the error lists
// the parts that failed. Pods are stopped only when the agent is not running (it would start
// them again).
func (u *uninstaller) purge(ctx context.Context, maxGrace time.Duration) error {
	unlock, err := u.agentStopped()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	fail := func(what string, err error) {
		if err != nil {
			u.say("FAILED %s: %v", what, err)
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}

	// Pods: containers first (their processes out of the cgroups and network namespaces), then
	// each pod's sandbox by the same teardown the agent uses (CNI DEL with the stored attachment).
	network := cni.New(cni.Options{ConfDir: u.cfg.CNIConfDir, BinDirs: u.cfg.CNIBinDirs,
		StateDir: filepath.Join(u.cfg.StateDir, "cni", "pods"), Log: u.log})
	rt, err := ctrd.New(ctx, ctrd.Options{Address: u.cfg.ContainerdAddress, Namespace: u.cfg.ContainerdNamespace,
		DialTimeout: u.cfg.ContainerdTimeout.Duration, StateDir: u.cfg.StateDir, Network: network, Log: u.log})
	if err != nil {
		// Without containerd nothing of the pods can be stopped: removing their cgroups, network
		// and state under running processes would only break them.
		return fmt.Errorf("%w; start containerd and run again (nothing was removed)", err)
	}
	defer rt.Close()
	ids, err := rt.RemoveAllContainers(ctx, maxGrace)
	u.say("removed %d container(s) of containerd namespace %s", len(ids), u.cfg.ContainerdNamespace)
	fail("remove containers", err)
	if err == nil {
		refs, err := rt.ListSandboxes()
		fail("list pod sandboxes", err)
		for _, ref := range refs {
			err := rt.RemoveSandbox(ctx, ref)
			if err == nil {
				u.say("removed pod %s: network, namespaces, cgroup, volumes, logs", ref)
			}
			fail("remove pod "+ref.String(), err)
		}
		imgs, err := rt.DeleteNamespace(ctx)
		u.say("removed %d image(s) and containerd namespace %s", len(imgs), u.cfg.ContainerdNamespace)
		fail("containerd namespace "+u.cfg.ContainerdNamespace, err)
		tops, scope := u.cgroupTops(ctx)
		for _, top := range tops {
			base := filepath.Join(top, u.cfg.ContainerdNamespace)
			// Processes whose container is gone may still sit in the pods' cgroups (children of an
			// init killed alone, as `ctr tasks kill` does): they are the pods' too.
			if n, err := killCgroupTree(base); n > 0 || err != nil {
				u.say("killed %d process(es) left in cgroups below %s", n, base)
				fail("kill processes below "+base, err)
			}
			if err := ctrd.RemoveCgroupTree(base); err != nil {
				fail("remove cgroups below "+base, err)
			} else {
				u.say("removed cgroups below %s", base)
				if filepath.Clean(top) != "/" {
					fail("remove cgroup "+top, ctrd.RemoveCgroup(top)) // only when empty
				}
			}
		}
		if scope != "" {
			// The scope goes (with its holder) once no other agent's pods are in it.
			stopped, err := delegate.Release(ctx, "/sys/fs/cgroup", nil)
			if stopped {
				u.say("stopped systemd unit %s", delegate.Unit)
			}
			fail("systemd unit "+delegate.Unit, err)
		}
	}

	// The default network: its file, its bridge, and rules a CNI DEL never removed.
	d := u.defaultNetwork()
	if removed, err := cni.RemoveDefault(u.cfg.CNIConfDir, d); removed {
		u.say("removed %s", filepath.Join(u.cfg.CNIConfDir, cni.DefaultConfFile))
	} else {
		fail("CNI network file", err)
	}
	if deleted, err := cni.DeleteBridge(d.Bridge); deleted {
		u.say("deleted bridge %s", d.Bridge)
	} else {
		fail("bridge "+d.Bridge, err)
	}
	rules, err := cni.RemoveNetworkRules(nil, d.Name)
	for _, r := range rules {
		u.say("removed %s", r)
	}
	fail("iptables rules of network "+d.Name, err)

	// Files mqlet made outside its state dir.
	if err := removeFile(u.cfg.SecretKeyFile); err == nil {
		u.say("removed node key %s", u.cfg.SecretKeyFile)
	} else if !errors.Is(err, os.ErrNotExist) {
		fail("node key", err)
	}
	dropIn := filepath.Join(shutdown.DefaultLogindConfDir, shutdown.LogindDropIn)
	if b, err := os.ReadFile(dropIn); err == nil && strings.HasPrefix(string(b), shutdown.LogindDropInMark) {
		fail("logind drop-in", os.Remove(dropIn))
		u.say("removed %s (logind reads it again at its next restart or boot)", dropIn)
	}

	// The state dir last: it holds the CNI attachments the teardown above needed. Nothing may be
	// mounted below it (RemoveAll would descend into a mount).
	if err := removeStateDir(u.cfg.StateDir); err != nil {
		fail("state dir", err)
	} else {
		u.say("removed state dir %s", u.cfg.StateDir)
	}
	// The API socket and the count of failed starts (agent_backoff.go), both under /run.
	for _, p := range []string{u.cfg.APISocket, startbackoff.Path(os.Getenv)} {
		if err := os.Remove(p); err == nil {
			u.say("removed %s", p)
		}
	}
	if dir := filepath.Dir(u.cfg.APISocket); filepath.Base(dir) == "mqlet" {
		os.Remove(dir) // only when empty
	}
	if len(errs) > 0 {
		return fmt.Errorf("uninstall: %d part(s) failed: %w", len(errs), errors.Join(errs...))
	}
	u.say("mqlet purged; kept the config file and the manifests in %s", u.cfg.ManifestDir)
	return nil
}

// agentStopped refuses while an agent runs with this state dir (it holds the state file's lock)
// or answers on the API socket, and otherwise holds the lock itself until unlock, so no agent
// starts in the middle of the purge.
func (u *uninstaller) agentStopped() (unlock func(), err error) {
	if conn, err := net.DialTimeout("unix", u.cfg.APISocket, time.Second); err == nil {
		conn.Close()
		return nil, fmt.Errorf("the agent is running (its API answers on %s): stop it first (systemctl stop mqlet); nothing was removed", u.cfg.APISocket)
	}
	path := u.cfg.StatePath()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return func() {}, nil
	} else if err != nil {
		return nil, fmt.Errorf("open state file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("the agent is running (it holds %s): stop it first (systemctl stop mqlet); nothing was removed", path)
		}
		return nil, fmt.Errorf("lock state file %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

func removeFile(path string) error {
	if path == "" {
		return os.ErrNotExist
	}
	return os.Remove(path)
}

// removeStateDir unmounts what is still mounted below dir (a pod's namespace or tmpfs whose
// teardown failed), deepest first, and removes dir only when nothing is mounted there any more:
// RemoveAll crosses mount points, and a bind mount there could be anything of the host's.
func removeStateDir(dir string) error {
	dir = filepath.Clean(dir)
	if dir == "/" || dir == "." || !filepath.IsAbs(dir) {
		return fmt.Errorf("refusing to remove state dir %q", dir)
	}
	mounts, err := mountsBelow(dir)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w; %s not removed", m, err, dir)
		}
	}
	if left, err := mountsBelow(dir); err != nil || len(left) > 0 {
		return fmt.Errorf("still mounted below %s: %v (%v); not removed", dir, left, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return nil
}

// mountsBelow lists the mount points at or below dir, deepest first.
func mountsBelow(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeOctal(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, s.Err()
}

// unescapeOctal undoes mountinfo's \040-style escapes of spaces, tabs, newlines and backslashes.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// killCgroupTree sends SIGKILL to every process in the cgroups at and below rel, in every
// mounted hierarchy, until none is left; it waits at most 10 s for them to go (a bound, as a
// process in uninterruptible sleep takes its time). It returns how many it signalled.
func killCgroupTree(rel string) (int, error) {
	// Every cgroup and cgroup2 mount, as the agent finds them: runc puts a container in each.
	l, err := cgroup.Detect("/proc/self/mountinfo", "/")
	if err != nil {
		return 0, err
	}
	var roots []string
	for _, m := range l.Mounts {
		roots = append(roots, filepath.Join(m, rel))
	}
	signalled := map[int]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []int
		for _, root := range roots {
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil
				}
				procs, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(procs)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
						left = append(left, pid)
					}
				}
				return nil
			})
		}
		if len(left) == 0 {
			return len(signalled), nil
		}
		if time.Now().After(deadline) {
			return len(signalled), fmt.Errorf("processes %v still in cgroups below %s 10 s after SIGKILL", left, rel)
		}
		for _, pid := range left {
			unix.Kill(pid, unix.SIGKILL)
			signalled[pid] = true
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupTops are the tops of the pods' cgroup trees, as paths below the hierarchy's root:
// cgroupRoot itself (cgroupDriver cgroupfs) and, when systemd runs the scope delegated to mqlet,
// cgroupRoot below it (cgroupDriver systemd), with that scope's cgroup. Both, whatever the config
// says now: the driver may have changed since the pods were made.
func (u *uninstaller) cgroupTops(ctx context.Context) (tops []string, scope string) {
	tops = []string{u.cfg.CgroupRoot}
	if !delegate.Booted("/") {
		return tops, ""
	}
	sys, err := delegate.Connect(ctx)
	if err != nil {
		u.say("systemd runs but does not answer (%v): its scope %s is left alone", err, delegate.Unit)
		return tops, ""
	}
	defer sys.Close()
	state, cg, err := sys.State(ctx, delegate.Unit)
	if err != nil || state != "active" || cg == "" {
		return tops, ""
	}
	return append(tops, path.Join(cg, u.cfg.CgroupRoot)), cg
}
