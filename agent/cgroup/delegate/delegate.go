// Package delegate asks systemd for the cgroup mqlet keeps its pods in on a systemd host: a
// transient scope, mqlet.slice/mqlet-pods.scope, with Delegate=yes, so that systemd knows the
// subtree, accounts for it, and by its delegation contract leaves everything below it to mqlet.
//
// Why a scope of its own and not Delegate=yes on mqlet.service: with KillMode=process the pods
// outlive the agent, so the unit's cgroup would keep children with controllers enabled after a
// stop, and cgroup v2 refuses a process in a cgroup whose subtree_control is not empty: systemd
// could not start the agent again (systemd 254's DelegateSubgroup= lifts that; Debian 12 and
// Raspberry Pi OS bookworm have 252). A scope is never started again: it lives as long as a process
// is in it, and systemd neither restarts nor reloads it. To keep it alive when no pod runs, a
// holder process (a sleep, see HolderCommand) sits in a leaf of it, `holder`; the leaf because
// the kernel lets a cgroup enable controllers for its children only while it holds no process.
//
// systemd is reached on its private socket (/run/systemd/private, root only), which needs no D-Bus
// daemon: minimal images often have none.
package delegate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

const (
	// Slice is the slice the scope lives in: mqlet's pods are accounted apart from system.slice.
	Slice = "mqlet.slice"
	// Unit is the scope delegated to mqlet.
	Unit = "mqlet-pods.scope"
	// HolderLeaf is the cgroup below the scope the holder process lives in.
	HolderLeaf = "holder"
)

// Booted reports whether systemd is the init system of the host under root, the way sd_booted(3)
// tells: /run/systemd/system exists.
func Booted(root string) bool {
	fi, err := os.Stat(filepath.Join(root, "run/systemd/system"))
	return err == nil && fi.IsDir()
}

// Options configures Ensure.
type Options struct {
	// Unified is the cgroup2 mount point (/sys/fs/cgroup).
	Unified string
	// Holder is the command that prints the pid of a holder process it started in the background
	// and exits (HolderCommand).
	Holder []string
	Log    *slog.Logger
	// Systemd talks to systemd; nil connects to its private socket.
	Systemd Systemd
}

// Systemd is what Ensure needs of systemd's manager interface.
type Systemd interface {
	// State is the unit's ActiveState ("active", "inactive", "failed", ...) and its cgroup
	// ("" when it has none).
	State(ctx context.Context, unit string) (state, cgroup string, err error)
	// StartScope starts a transient scope with these properties and waits for its job's result.
	StartScope(ctx context.Context, unit string, props []sd.Property) error
	ResetFailed(ctx context.Context, unit string) error
	// Stop stops the unit and waits for its job's result.
	Stop(ctx context.Context, unit string) error
	Close()
}

// Ensure returns the cgroup of the delegated scope (as a path below the hierarchy's root, e.g.
// /mqlet.slice/mqlet-pods.scope), starting the scope and its holder when it is not running. A scope
// already running (an agent restart, an upgrade) is used as it is, with the pods in it; when its
// holder is gone (killed), a new one is put in its leaf, or the scope would end with its last pod.
func Ensure(ctx context.Context, o Options) (string, error) {
	cg, _, err := ensure(ctx, o)
	return cg, err
}

// Keep is Ensure for a running agent whose scope is cg: nothing when its holder is there (no call
// to systemd); a new holder when it is gone while the scope runs; the scope started anew when it
// went (its holder killed while no pod ran: systemd stops an empty scope and removes its cgroup,
// mqlet's tree below it with it). restarted says the tree has to be made again.
func Keep(ctx context.Context, o Options, cg string) (restarted bool, err error) {
	if Holding(o.Unified, cg) {
		return false, nil
	}
	got, started, err := ensure(ctx, o)
	if err == nil && got != cg {
		err = fmt.Errorf("systemd unit %s came back with cgroup %s, not %s: restart mqlet", Unit, got, cg)
	}
	return started, err
}

// Holding reports whether the holder leaf of the scope's cgroup cg has a process.
func Holding(unified, cg string) bool {
	b, err := os.ReadFile(filepath.Join(unified, cg, HolderLeaf, "cgroup.procs"))
	return err == nil && strings.TrimSpace(string(b)) != ""
}

func ensure(ctx context.Context, o Options) (cg string, started bool, err error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	sys := o.Systemd
	if sys == nil {
		var err error
		if sys, err = Connect(ctx); err != nil {
			return "", false, err
		}
	}
	defer sys.Close()
	state, cg, err := sys.State(ctx, Unit)
	if err != nil {
		return "", false, err
	}
	switch state {
	case "active":
		if cg == "" {
			return "", false, fmt.Errorf("systemd unit %s is active but has no cgroup", Unit)
		}
		if !Holding(o.Unified, cg) {
			pid, err := startHolder(ctx, o.Holder)
			if err != nil {
				return "", false, err
			}
			if err := placeHolder(o.Unified, cg, pid); err != nil {
				return "", false, err
			}
			o.Log.Warn("the systemd scope delegated to mqlet had no holder (killed?): started a new one", "unit", Unit, "cgroup", cg, "holder", pid)
		}
		o.Log.Info("pod cgroups in the systemd scope delegated to mqlet", "unit", Unit, "cgroup", cg)
		return cg, false, nil
	case "failed":
		// A scope that failed (its stop timed out, say) keeps its name until reset.
		if err := sys.ResetFailed(ctx, Unit); err != nil {
			return "", false, fmt.Errorf("reset failed systemd unit %s: %w", Unit, err)
		}
	case "inactive", "":
	default:
		return "", false, fmt.Errorf("systemd unit %s is %s: wait until it has stopped, or stop it (systemctl stop %s), then start mqlet again", Unit, state, Unit)
	}
	pid, err := startHolder(ctx, o.Holder)
	if err != nil {
		return "", false, err
	}
	if err := startScope(ctx, sys, pid); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		// Another agent (of another containerd namespace) may have started it meanwhile.
		if state, cg, serr := sys.State(ctx, Unit); serr == nil && state == "active" && cg != "" {
			o.Log.Info("pod cgroups in the systemd scope delegated to mqlet", "unit", Unit, "cgroup", cg)
			return cg, true, nil
		}
		return "", false, err
	}
	if _, cg, err = sys.State(ctx, Unit); err != nil || cg == "" {
		syscall.Kill(pid, syscall.SIGKILL)
		return "", false, fmt.Errorf("systemd unit %s: read its cgroup: %v", Unit, err)
	}
	if err := placeHolder(o.Unified, cg, pid); err != nil {
		return "", false, err
	}
	o.Log.Info("started the systemd scope delegated to mqlet for pod cgroups", "unit", Unit, "cgroup", cg, "holder", pid)
	return cg, true, nil
}

// placeHolder moves the holder pid to the leaf of the scope's cgroup cg, so mqlet can enable
// controllers in the scope's own cgroup; on failure the holder is killed.
func placeHolder(unified, cg string, pid int) error {
	leaf := filepath.Join(unified, cg, HolderLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Errorf("make the holder's cgroup %s: %w", leaf, err)
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Errorf("move the holder (pid %d) to %s: %w", pid, leaf, err)
	}
	return nil
}

// HolderCommand is the holder the agent starts: the system's sleep (coreutils; Debian and
// Raspberry Pi OS always have it), started in the background by sh, which prints its pid, so the
// holder costs about 100 KB of memory of its own; without them, `<exe> cgroup-holder`, the mqlet
// binary (about 10 MB of its own for the Go runtime and its packages' init). Either way the holder
// is init's child, not the agent's: nothing for the agent to reap, and it does not end with the
// agent. exe "" and no sleep: nil (Ensure refuses).
func HolderCommand(exe string) []string {
	sh, err1 := exec.LookPath("/bin/sh")
	sleep, err2 := exec.LookPath("sleep")
	if err1 == nil && err2 == nil && !strings.ContainsAny(sleep, " '\"$`") {
		// A background command of a non-interactive shell ignores SIGINT: a ^C of an agent run by
		// hand does not reach it.
		return []string{sh, "-c", "'" + sleep + "' infinity </dev/null >/dev/null 2>&1 & echo $!"}
	}
	if exe == "" {
		return nil
	}
	return []string{exe, "cgroup-holder"}
}

// ScopeProperties are the transient scope's properties: delegated to mqlet, in Slice, with no
// task limit of systemd's (DefaultTasksMax would cap all pods' processes together at 15% of the
// kernel's pid limit; podPidsLimit and node allocatable are mqlet's), and OOM kills inside left
// to mqlet (systemd 253's OOMPolicy for scopes would otherwise stop the whole scope, every pod,
// at the first kill; withOOMPolicy false for systemd 252, which has no such property for scopes
// and never stops a scope on an OOM kill).
func ScopeProperties(pid int, withOOMPolicy bool) []sd.Property {
	props := []sd.Property{
		sd.PropDescription("mqlet pods (cgroups delegated to mqlet)"),
		sd.PropSlice(Slice),
		sd.PropPids(uint32(pid)),
		{Name: "Delegate", Value: dbus.MakeVariant(true)},
		{Name: "TasksMax", Value: dbus.MakeVariant(uint64(math.MaxUint64))},
	}
	if withOOMPolicy {
		props = append(props, sd.Property{Name: "OOMPolicy", Value: dbus.MakeVariant("continue")})
	}
	return props
}

// startScope starts the scope around pid, without OOMPolicy when this systemd does not know it
// for scopes.
func startScope(ctx context.Context, sys Systemd, pid int) error {
	err := sys.StartScope(ctx, Unit, ScopeProperties(pid, true))
	if err != nil && unknownProperty(err) {
		err = sys.StartScope(ctx, Unit, ScopeProperties(pid, false))
	}
	if err != nil {
		return fmt.Errorf("start systemd scope %s in %s around pid %d: %w", Unit, Slice, pid, err)
	}
	return nil
}

// unknownProperty is systemd's refusal of a property it does not have for the unit type
// ("Cannot set property OOMPolicy, or unknown property.").
func unknownProperty(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) && de.Name == "org.freedesktop.DBus.Error.PropertyReadOnly" {
		return true
	}
	return strings.Contains(err.Error(), "unknown property")
}

// holderStartWait bounds the holder command, which only starts a process and prints its pid.
const holderStartWait = 30 * time.Second

// startHolder runs the holder command and returns the pid it prints. The command's own process
// exits at once and is waited for here; the holder it started was reparented to init, so nothing
// of it is left for the agent to reap.
func startHolder(ctx context.Context, argv []string) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("no holder command for the systemd scope (the agent's own binary is unknown)")
	}
	ctx, cancel := context.WithTimeout(ctx, holderStartWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{}
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return 0, fmt.Errorf("start the systemd scope's holder (%s): %w", strings.Join(argv, " "), err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("start the systemd scope's holder (%s): printed %q, not a pid", strings.Join(argv, " "), out)
	}
	return pid, nil
}

// Release is the end of the scope for `mqlet uninstall`: when nothing but the holder is left in it
// (other agents of other containerd namespaces may keep pods there), it is stopped, which ends the
// holder, and systemd removes its cgroup. It reports whether it stopped it.
func Release(ctx context.Context, unified string, sys Systemd) (bool, error) {
	if sys == nil {
		var err error
		if sys, err = Connect(ctx); err != nil {
			return false, err
		}
	}
	defer sys.Close()
	state, cg, err := sys.State(ctx, Unit)
	if err != nil || state != "active" || cg == "" {
		return false, err
	}
	entries, err := os.ReadDir(filepath.Join(unified, cg))
	if err != nil {
		return false, fmt.Errorf("read the scope's cgroup: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != HolderLeaf {
			return false, nil // someone's pods are still there
		}
	}
	if err := sys.Stop(ctx, Unit); err != nil {
		return false, fmt.Errorf("stop systemd unit %s: %w", Unit, err)
	}
	// The slice was started for the scope; with nothing left in it, it goes too (its cgroup
	// with it), so a purge leaves the hierarchy as it found it.
	if entries, err := os.ReadDir(filepath.Join(unified, path.Dir(cg))); err == nil && !slices.ContainsFunc(entries, os.DirEntry.IsDir) {
		if err := sys.Stop(ctx, Slice); err != nil {
			return true, fmt.Errorf("stop systemd unit %s: %w", Slice, err)
		}
	}
	return true, nil
}

// Connect reaches systemd on its private socket.
func Connect(ctx context.Context) (Systemd, error) {
	c, err := sd.NewSystemdConnectionContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd (/run/systemd/private; cgroupDriver systemd needs systemd as init and root): %w", err)
	}
	return conn{c}, nil
}

type conn struct{ c *sd.Conn }

func (c conn) Close() { c.c.Close() }

func (c conn) State(ctx context.Context, unit string) (string, string, error) {
	p, err := c.c.GetUnitPropertyContext(ctx, unit, "ActiveState")
	if err != nil {
		return "", "", fmt.Errorf("systemd unit %s: read ActiveState: %w", unit, err)
	}
	state, _ := p.Value.Value().(string)
	if state == "inactive" {
		return state, "", nil
	}
	t, err := c.c.GetUnitTypePropertiesContext(ctx, unit, "Scope")
	if err != nil {
		return "", "", fmt.Errorf("systemd unit %s: read its scope properties: %w", unit, err)
	}
	cg, _ := t["ControlGroup"].(string)
	if cg != "" {
		cg = path.Clean(cg)
	}
	return state, cg, nil
}

func (c conn) StartScope(ctx context.Context, unit string, props []sd.Property) error {
	done := make(chan string, 1)
	if _, err := c.c.StartTransientUnitContext(ctx, unit, "fail", props, done); err != nil {
		return err
	}
	return jobResult(ctx, "start", unit, done)
}

func (c conn) Stop(ctx context.Context, unit string) error {
	done := make(chan string, 1)
	if _, err := c.c.StopUnitContext(ctx, unit, "fail", done); err != nil {
		return err
	}
	return jobResult(ctx, "stop", unit, done)
}

func (c conn) ResetFailed(ctx context.Context, unit string) error {
	return c.c.ResetFailedUnitContext(ctx, unit)
}

// jobResult waits for a job's result; anything but "done" is a failure.
func jobResult(ctx context.Context, what, unit string, done <-chan string) error {
	select {
	case r := <-done:
		if r != "done" {
			return fmt.Errorf("%s job of %s ended %q (journalctl -u %s says why)", what, unit, r, unit)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s job of %s: %w", what, unit, ctx.Err())
	}
}
