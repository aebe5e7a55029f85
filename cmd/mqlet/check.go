package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/cgroup/delegate"
	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/node"

	"golang.org/x/sys/unix"
)

// CheckCmd is `mqlet check`: a preflight, like `k3s check-config`, that says item by item whether
// this machine can run mqlet's pods, and how to fix what cannot. It reads the agent's settings the
// way `mqlet agent` does (same flags, MQLET_* variables and --config) and changes nothing: no
// cgroup, state file or network is made.
type CheckCmd struct {
	config.Flags `embed:""`
}

// Help says what the exit status means.
func (CheckCmd) Help() string {
	return "Exit status 0 when the node can run pods (warnings allowed), 1 when an item FAILs."
}

// Run checks this machine and prints the items.
func (c *CheckCmd) Run(env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	p := preflight{root: "/", now: env.now(), environ: os.Environ(), lookPath: lookPathSbin, command: runFirstLine, containerd: containerdVersion}
	items := p.run(ctx, c.Flags)
	if fails := printCheck(env.out, items); fails > 0 {
		return fmt.Errorf("check: %d of %d items failed", fails, len(items))
	}
	return nil
}

// checkStatus is how an item turned out.
type checkStatus string

const (
	checkOK   checkStatus = "OK"
	checkWarn checkStatus = "WARN" // pods run, but something an owner should know about
	checkFail checkStatus = "FAIL" // pods cannot run (or the agent refuses to start) until it is fixed
)

// checkItem is one line of the report: what was checked, what was found, and the fix.
type checkItem struct {
	name   string
	status checkStatus
	found  string
	fix    string // empty when there is nothing to do
}

// preflight holds what the checks read, so tests can give a fixture tree and fakes.
type preflight struct {
	root    string // "/" or a fixture tree: /proc and /sys are read under it
	now     time.Time
	environ []string
	// lookPath finds a program, as the agent's children (containerd's shim, CNI) would.
	lookPath func(name string) (string, error)
	// command runs a program and returns the first line of its output.
	command func(ctx context.Context, path string, args ...string) (string, error)
	// containerd connects as the agent would and returns the daemon's version.
	containerd func(ctx context.Context, cfg config.Config) (string, error)
}

// clockFloor is a time before this release was made: a clock behind it is certainly wrong (a Pi
// has no battery-backed clock and starts at its image's date until NTP answers).
var clockFloor = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// run checks every item, in the order an owner fixes them: the settings first, then the kernel,
// then what the pods run on.
func (p preflight) run(ctx context.Context, flags config.Flags) []checkItem {
	var items []checkItem
	cfg, err := config.Load(flags, p.environ)
	if err != nil {
		items = append(items, checkItem{"config", checkFail, err.Error(),
			"correct the setting named, in the config file, the MQLET_* variable or the flag it came from; the items below use the defaults"})
		cfg = config.Defaults()
	} else {
		from := "no file: defaults, MQLET_* variables and flags"
		if flags.Config != "" {
			from = flags.Config
		}
		items = append(items, checkItem{name: "config", status: checkOK, found: "valid (" + from + ")"})
	}
	items = append(items, p.kernel())
	items = append(items, p.cgroups(cfg)...)
	items = append(items, p.containerdItem(ctx, cfg), p.runc(ctx), p.cni(cfg), p.iptables(), p.stateDir(cfg), p.clock(), p.swap())
	return items
}

func (p preflight) kernel() checkItem {
	b, err := os.ReadFile(filepath.Join(p.root, "proc/sys/kernel/osrelease"))
	if err != nil {
		return checkItem{"kernel", checkWarn, fmt.Sprintf("cannot read the kernel release: %v", err), ""}
	}
	return checkItem{name: "kernel", status: checkOK, found: fmt.Sprintf("Linux %s (%s)", strings.TrimSpace(string(b)), runtime.GOARCH)}
}

// cgroups reports the mode, whether the cpu, memory and pids controllers are there, as the
// agent's start judges them (cgroup.Layout.Preflight), and which cgroup driver the agent would use.
func (p preflight) cgroups(cfg config.Config) []checkItem {
	l, err := cgroup.Detect(filepath.Join(p.root, "proc/self/mountinfo"), p.root)
	if err != nil {
		return []checkItem{{"cgroups", checkFail, err.Error(), "mount /proc (the agent reads /proc/self/mountinfo)"}}
	}
	mode := checkItem{name: "cgroup mode", status: checkOK, found: l.Mode.String()}
	if l.Mode == cgroup.Unavailable {
		mode.status, mode.fix = checkFail, "mount cgroup2 at /sys/fs/cgroup (systemd does at boot)"
	}
	ctl := checkItem{name: "cgroup controllers", status: checkOK, found: "cpu, memory and pids are there"}
	if err := l.Preflight(); err != nil {
		ctl.status, ctl.found = checkFail, err.Error()
		var ce *cgroup.ControllerError
		if errors.As(err, &ce) && slices.Contains(ce.Missing, "memory") {
			ctl.fix = "on a Raspberry Pi: append ' cgroup_enable=memory cgroup_memory=1' to the single line of /boot/firmware/cmdline.txt (/boot/cmdline.txt before Bookworm) and reboot"
		} else {
			ctl.fix = "see above: the kernel command line or the cgroup mounts"
		}
	}
	driver := checkItem{name: "cgroup driver", status: checkOK}
	d, why, err := node.CgroupDriver(cfg, l, delegate.Booted(p.root))
	switch {
	case err != nil:
		driver.status, driver.found, driver.fix = checkFail, err.Error(), "set cgroupDriver to auto or cgroupfs"
	case d == config.CgroupDriverSystemd:
		driver.found = fmt.Sprintf("systemd (%s): pods below the scope systemd delegates to mqlet, /%s/%s%s", why, delegate.Slice, delegate.Unit, path.Join(cfg.CgroupRoot, cfg.ContainerdNamespace))
	default:
		driver.found = fmt.Sprintf("cgroupfs (%s): pods below %s at the hierarchy's root", why, path.Join(cfg.CgroupRoot, cfg.ContainerdNamespace))
	}
	return []checkItem{mode, ctl, driver}
}

func (p preflight) containerdItem(ctx context.Context, cfg config.Config) checkItem {
	v, err := p.containerd(ctx, cfg)
	if err != nil {
		return checkItem{"containerd", checkFail, err.Error(),
			"apt install containerd; systemctl enable --now containerd (or set containerdAddress to its socket)"}
	}
	it := checkItem{name: "containerd", status: checkOK, found: fmt.Sprintf("%s at %s", v, cfg.ContainerdSocketPath())}
	if !supportedContainerd(v) {
		it.status, it.fix = checkWarn, "mqlet supports containerd 1.6, 1.7 and 2.x; others are untested"
	}
	return it
}

// supportedContainerd says whether version (e.g. "1.6.20~ds1", "v2.0.1") is 1.6, 1.7 or 2.x.
func supportedContainerd(version string) bool {
	major, rest, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ := strings.Cut(rest, ".")
	m, err1 := strconv.Atoi(major)
	n, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil {
		return false
	}
	return m == 2 || m == 1 && (n == 6 || n == 7)
}

// containerdVersion connects as the agent does.
func containerdVersion(ctx context.Context, cfg config.Config) (string, error) {
	rt, err := ctrd.New(ctx, ctrd.Options{Address: cfg.ContainerdAddress, Namespace: cfg.ContainerdNamespace, DialTimeout: cfg.ContainerdTimeout.Duration})
	if err != nil {
		return "", err
	}
	defer rt.Close()
	return rt.Version(), nil
}

func (p preflight) runc(ctx context.Context) checkItem {
	path, err := p.lookPath("runc")
	if err != nil {
		return checkItem{"runc", checkFail, "runc not found: containerd runs every container with it", "apt install runc"}
	}
	v, err := p.command(ctx, path, "--version")
	if err != nil {
		return checkItem{"runc", checkFail, fmt.Sprintf("%s --version: %v", path, err), "reinstall runc (apt install --reinstall runc)"}
	}
	return checkItem{name: "runc", status: checkOK, found: fmt.Sprintf("%s (%s)", v, path)}
}

// cni checks the network pods get: the first configuration in cniConfDir and its plugins, or,
// when the directory holds none, the plugins of the default network the agent writes there.
func (p preflight) cni(cfg config.Config) checkItem {
	const fix = "apt install containernetworking-plugins (it installs them in /usr/lib/cni), or set cniBinDirs"
	dirs := strings.Join(cfg.CNIBinDirs, ", ")
	confDir, found := cfg.CNIConfDir, "the configuration in "+cfg.CNIConfDir
	if !hasCNIConf(cfg.CNIConfDir) {
		// Judge the default network as written, in a scratch directory: nothing on the host changes.
		tmp, err := os.MkdirTemp("", "mqlet-check-cni")
		if err != nil {
			return checkItem{"CNI", checkWarn, fmt.Sprintf("cannot judge the default network: %v", err), ""}
		}
		defer os.RemoveAll(tmp)
		d := cni.DefaultNetwork{Name: cni.DefaultNetworkName, Bridge: cni.DefaultBridge, Subnet: cfg.PodNetwork().String(), DataDir: filepath.Join(tmp, "data")}
		if _, err := cni.WriteDefault(tmp, d); err != nil {
			return checkItem{"CNI", checkWarn, fmt.Sprintf("cannot judge the default network: %v", err), ""}
		}
		confDir = tmp
		found = fmt.Sprintf("no configuration in %s: the agent writes its default (bridge %s on %s)", cfg.CNIConfDir, cni.DefaultBridge, d.Subnet)
	}
	if err := cni.New(cni.Options{ConfDir: confDir, BinDirs: cfg.CNIBinDirs}).Ready(); err != nil {
		msg := strings.ReplaceAll(err.Error(), confDir, cfg.CNIConfDir)
		return checkItem{"CNI", checkFail, msg + "; pods without hostNetwork wait until it is fixed", fix}
	}
	return checkItem{name: "CNI", status: checkOK, found: found + "; its plugins are in " + dirs}
}

// hasCNIConf says whether dir holds a configuration file (valid or not: an invalid one is the
// operator's to fix, and Ready says which).
func hasCNIConf(dir string) bool {
	for _, pat := range []string{"*.conflist", "*.conf", "*.json"} {
		if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) > 0 {
			return true
		}
	}
	return false
}

func (p preflight) iptables() checkItem {
	path, err := p.lookPath("iptables")
	if err != nil {
		return checkItem{"iptables", checkFail, "iptables not found: the CNI bridge's masquerade and portmap's hostPort rules need it", "apt install iptables"}
	}
	return checkItem{name: "iptables", status: checkOK, found: path}
}

// stateDir checks that the state dir is (or can be made) writable, and on what file system.
func (p preflight) stateDir(cfg config.Config) checkItem {
	dir := cfg.StateDir
	found := dir
	probe := dir
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		// The agent makes it: its nearest existing parent must take a new directory.
		for probe = filepath.Dir(dir); ; probe = filepath.Dir(probe) {
			if _, err := os.Stat(probe); err == nil || probe == filepath.Dir(probe) {
				break
			}
		}
		found = fmt.Sprintf("%s does not exist yet (the agent makes it in %s)", dir, probe)
	}
	f, err := os.CreateTemp(probe, ".mqlet-check-*")
	if err != nil {
		return checkItem{"state dir", checkFail, fmt.Sprintf("%s is not writable: %v", probe, err),
			"run mqlet as root, or set stateDir (--state-dir) to a writable directory on persistent storage"}
	}
	f.Close()
	os.Remove(f.Name())
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err != nil {
		return checkItem{"state dir", checkWarn, fmt.Sprintf("%s: cannot read its file system: %v", found, err), ""}
	}
	fsName := fsTypeName(int64(st.Type))
	free := int64(st.Bavail) * int64(st.Bsize)
	it := checkItem{name: "state dir", status: checkOK, found: fmt.Sprintf("%s, writable, on %s (%s free)", found, fsName, humanSize(free))}
	switch fsName {
	case "tmpfs", "ramfs":
		it.status, it.fix = checkWarn, "the state file does not survive a reboot there (pods from MQTT, statuses and the outbox are lost): set stateDir to persistent storage"
	case "vfat", "exfat":
		it.status, it.fix = checkWarn, fsName+" keeps no file modes (the state dir must be private, 0700): use ext4, f2fs or btrfs"
	}
	if free < 64<<20 {
		it.status, it.fix = checkWarn, "less than 64 MB free: container logs, emptyDirs and the state file need room"
	}
	return it
}

// fsTypeName names the file systems a state dir is likely on; others by their magic number.
func fsTypeName(t int64) string {
	switch t {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4" // also ext2 and ext3: one magic number
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.RAMFS_MAGIC:
		return "ramfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.F2FS_SUPER_MAGIC:
		return "f2fs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.MSDOS_SUPER_MAGIC:
		return "vfat"
	case unix.EXFAT_SUPER_MAGIC:
		return "exfat"
	case unix.SQUASHFS_MAGIC:
		return "squashfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	}
	return fmt.Sprintf("file system 0x%x", t)
}

func (p preflight) clock() checkItem {
	if p.now.Before(clockFloor) {
		return checkItem{"clock", checkWarn, fmt.Sprintf("%s is before %s: the clock is wrong, so TLS (registries, the broker) fails and times in statuses are wrong",
			p.now.UTC().Format(time.RFC3339), clockFloor.Format("2006-01-02")),
			"timedatectl set-ntp true (systemd-timesyncd), or fake-hwclock on a device without a real-time clock"}
	}
	return checkItem{name: "clock", status: checkOK, found: p.now.UTC().Format(time.RFC3339)}
}

// swap reads /proc/swaps.
func (p preflight) swap() checkItem {
	devices, err := hw.SwapDevices(p.root)
	if err != nil {
		return checkItem{"swap", checkWarn, fmt.Sprintf("cannot read /proc/swaps: %v", err), ""}
	}
	if len(devices) == 0 {
		return checkItem{name: "swap", status: checkOK, found: "off"}
	}
	return checkItem{"swap", checkWarn, "on (" + strings.Join(devices, ", ") + "): containers cannot swap (their memory.swap.max is 0, or memory+swap is their memory limit on v1), but the system can, and memory pressure is seen late",
		"if pods must not swap: swapoff -a and remove it from /etc/fstab (Raspberry Pi OS: dphys-swapfile swapoff && systemctl disable dphys-swapfile)"}
}

// printCheck writes the report and returns how many items failed.
func printCheck(out io.Writer, items []checkItem) int {
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fails, warns := 0, 0
	for _, it := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", it.status, it.name, it.found)
		if it.fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", it.fix)
		}
		switch it.status {
		case checkFail:
			fails++
		case checkWarn:
			warns++
		}
	}
	tw.Flush()
	switch {
	case fails > 0:
		fmt.Fprintf(out, "\n%d of %d items failed: this node cannot run pods until they are fixed.\n", fails, len(items))
	case warns > 0:
		fmt.Fprintf(out, "\nThis node can run pods; %d warning(s) above.\n", warns)
	default:
		fmt.Fprintln(out, "\nThis node can run pods.")
	}
	return fails
}

// lookPathSbin is exec.LookPath, also in the sbin directories a user's PATH often lacks (iptables
// lives in /usr/sbin).
func lookPathSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not in PATH nor in /usr/local/sbin, /usr/sbin, /sbin", name)
}

// runFirstLine runs path args and returns the first line of its output.
func runFirstLine(ctx context.Context, path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}
