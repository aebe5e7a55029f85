package delegate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// fakeSystemd stands in for systemd's manager: the real one is exercised by the cgroup v2 guest
// lane (scripts/vm/guest.sh), where mqlet runs under systemd as PID 1.
type fakeSystemd struct {
	state, cgroup string
	noOOMPolicy   bool  // refuse OOMPolicy for scopes, as systemd 252 does
	startErr      error // the start job's failure
	started       [][]sd.Property
	reset         int
	stopped       []string
	scopeDir      string
	afterStart    func() // what another agent did while the start failed
}

func (f *fakeSystemd) State(context.Context, string) (string, string, error) {
	return f.state, f.cgroup, nil
}

func (f *fakeSystemd) StartScope(_ context.Context, unit string, props []sd.Property) error {
	f.started = append(f.started, props)
	for _, p := range props {
		if p.Name == "OOMPolicy" && f.noOOMPolicy {
			return dbus.Error{Name: "org.freedesktop.DBus.Error.PropertyReadOnly", Body: []any{"Cannot set property OOMPolicy, or unknown property."}}
		}
	}
	if f.startErr != nil {
		if f.afterStart != nil {
			f.afterStart()
		}
		return f.startErr
	}
	f.state, f.cgroup = "active", "/"+Slice+"/"+unit
	return nil
}

func (f *fakeSystemd) ResetFailed(context.Context, string) error {
	f.reset++
	f.state = "inactive"
	return nil
}
func (f *fakeSystemd) Stop(_ context.Context, unit string) error {
	f.stopped = append(f.stopped, unit)
	if unit == Unit {
		f.state = "inactive"
		os.RemoveAll(f.scopeDir) // systemd removes the scope's cgroup once it stopped
	}
	return nil
}
func (f *fakeSystemd) Close() {}

// holderCmd is the holder the agent starts on this machine: the system's sleep.
var holderCmd = HolderCommand("")

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func property(props []sd.Property, name string) (any, bool) {
	for _, p := range props {
		if p.Name == name {
			return p.Value.Value(), true
		}
	}
	return nil, false
}

func TestEnsureStartsTheScopeAroundAHolderInALeaf(t *testing.T) {
	unified := t.TempDir()
	os.MkdirAll(filepath.Join(unified, Slice, Unit), 0o755)
	f := &fakeSystemd{state: "inactive", noOOMPolicy: true}
	cg, err := Ensure(context.Background(), Options{Unified: unified, Holder: holderCmd, Systemd: f})
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if cg != "/mqlet.slice/mqlet-pods.scope" {
		t.Errorf("Ensure = %q, want the scope's cgroup", cg)
	}
	// Tried with OOMPolicy, then without it for a systemd that does not know it for scopes.
	if len(f.started) != 2 {
		t.Fatalf("%d start attempts, want 2 (with OOMPolicy, then without)", len(f.started))
	}
	props := f.started[1]
	if _, ok := property(props, "OOMPolicy"); ok {
		t.Errorf("second attempt still sets OOMPolicy")
	}
	if v, _ := property(f.started[0], "OOMPolicy"); v != "continue" {
		t.Errorf("OOMPolicy = %v, want continue (an OOM kill of a container must not stop every pod)", v)
	}
	for name, want := range map[string]any{"Delegate": true, "Slice": Slice, "TasksMax": uint64(1<<64 - 1)} {
		if v, _ := property(props, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	pids, _ := property(props, "PIDs")
	p, ok := pids.([]uint32)
	if !ok || len(p) != 1 {
		t.Fatalf("PIDs = %v, want the holder's", pids)
	}
	pid := int(p[0])
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err != nil || string(comm) != "sleep\n" {
		t.Errorf("holder pid %d is %q (%v), want a running sleep", pid, comm, err)
	}
	got, err := os.ReadFile(filepath.Join(unified, cg, HolderLeaf, "cgroup.procs"))
	if err != nil || strings.TrimSpace(string(got)) != strconv.Itoa(pid) {
		t.Errorf("holder leaf's cgroup.procs = %q, %v; want the holder's pid %d", got, err, pid)
	}
}

func TestEnsureUsesARunningScopeAsItIs(t *testing.T) {
	unified := t.TempDir()
	f := &fakeSystemd{state: "active", cgroup: "/mqlet.slice/mqlet-pods.scope"}
	os.MkdirAll(filepath.Join(unified, f.cgroup, HolderLeaf), 0o755)
	os.WriteFile(filepath.Join(unified, f.cgroup, HolderLeaf, "cgroup.procs"), []byte("4242\n"), 0o644)
	cg, err := Ensure(context.Background(), Options{Unified: unified, Holder: []string{"false"}, Systemd: f})
	if err != nil || cg != f.cgroup || len(f.started) != 0 {
		t.Errorf("Ensure = %q, %v after %d starts; want the running scope's cgroup and no start", cg, err, len(f.started))
	}
}

// A scope whose holder was killed while pods kept it running: an agent's start puts a new holder
// in its leaf, or the scope (and mqlet's tree in it) would end with the last pod.
func TestEnsureGivesARunningScopeANewHolder(t *testing.T) {
	unified := t.TempDir()
	f := &fakeSystemd{state: "active", cgroup: "/mqlet.slice/mqlet-pods.scope"}
	procs := filepath.Join(unified, f.cgroup, HolderLeaf, "cgroup.procs")
	os.MkdirAll(filepath.Dir(procs), 0o755)
	os.WriteFile(procs, nil, 0o644) // the killed holder's leaf: empty
	cg, err := Ensure(context.Background(), Options{Unified: unified, Holder: holderCmd, Systemd: f})
	if err != nil || cg != f.cgroup || len(f.started) != 0 {
		t.Fatalf("Ensure = %q, %v after %d starts; want the running scope's cgroup and no start", cg, err, len(f.started))
	}
	b, _ := os.ReadFile(procs)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !alive(pid) {
		t.Fatalf("holder leaf's cgroup.procs = %q after Ensure, want a new holder's pid", b)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// Keep under a running agent: nothing while the holder is there; a scope that went (its holder
// killed while no pod ran) is started again and said so, for the tree to be made again.
func TestKeep(t *testing.T) {
	unified := t.TempDir()
	cg := "/" + Slice + "/" + Unit
	procs := filepath.Join(unified, cg, HolderLeaf, "cgroup.procs")
	os.MkdirAll(filepath.Dir(procs), 0o755)
	os.WriteFile(procs, []byte("4242\n"), 0o644)
	f := &fakeSystemd{state: "failed"} // not asked while the holder is there
	if restarted, err := Keep(context.Background(), Options{Unified: unified, Holder: holderCmd, Systemd: f}, cg); restarted || err != nil || f.reset != 0 {
		t.Fatalf("Keep with a holder = %v, %v (%d resets); want nothing done", restarted, err, f.reset)
	}
	os.RemoveAll(filepath.Join(unified, Slice)) // systemd stopped the empty scope
	os.MkdirAll(filepath.Join(unified, cg), 0o755)
	f = &fakeSystemd{state: "inactive"}
	restarted, err := Keep(context.Background(), Options{Unified: unified, Holder: holderCmd, Systemd: f}, cg)
	if !restarted || err != nil || len(f.started) == 0 {
		t.Fatalf("Keep with the scope gone = %v, %v after %d starts; want it started again and restarted true", restarted, err, len(f.started))
	}
	b, _ := os.ReadFile(procs)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
		syscall.Kill(pid, syscall.SIGKILL)
	} else {
		t.Errorf("holder leaf's cgroup.procs = %q after Keep, want the new holder's pid", b)
	}
}

func TestEnsureResetsAFailedScope(t *testing.T) {
	unified := t.TempDir()
	os.MkdirAll(filepath.Join(unified, Slice, Unit), 0o755)
	f := &fakeSystemd{state: "failed"}
	cg, err := Ensure(context.Background(), Options{Unified: unified, Holder: holderCmd, Systemd: f})
	if err != nil || f.reset != 1 {
		t.Fatalf("Ensure on a failed scope = %q, %v after %d resets; want it reset and started", cg, err, f.reset)
	}
	pids, _ := property(f.started[0], "PIDs")
	t.Cleanup(func() { syscall.Kill(int(pids.([]uint32)[0]), syscall.SIGKILL) })
}

func TestEnsureRefusesAScopeBeingStopped(t *testing.T) {
	f := &fakeSystemd{state: "deactivating"}
	_, err := Ensure(context.Background(), Options{Unified: t.TempDir(), Holder: holderCmd, Systemd: f})
	if err == nil || !strings.Contains(err.Error(), "deactivating") || len(f.started) != 0 {
		t.Errorf("Ensure on a scope being stopped = %v after %d starts; want a refusal naming its state", err, len(f.started))
	}
}

// A start that fails leaves no holder behind.
func TestEnsureStartFailureEndsTheHolder(t *testing.T) {
	f := &fakeSystemd{state: "inactive", startErr: errors.New("start job of mqlet-pods.scope ended \"failed\"")}
	_, err := Ensure(context.Background(), Options{Unified: t.TempDir(), Holder: holderCmd, Systemd: f})
	if err == nil || !strings.Contains(err.Error(), "failed") {
		t.Fatalf("Ensure = %v, want the start job's failure", err)
	}
	pids, _ := property(f.started[0], "PIDs")
	pid := int(pids.([]uint32)[0])
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		// The holder is killed, then reaped by init; until then it is a zombie, which Kill(0) sees.
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(b), ") Z ") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("holder pid %d still runs after the failed start", pid)
	}
}

func TestEnsureHolderThatPrintsNoPid(t *testing.T) {
	f := &fakeSystemd{state: "inactive"}
	_, err := Ensure(context.Background(), Options{Unified: t.TempDir(), Holder: []string{"echo", "hello"}, Systemd: f})
	if err == nil || !strings.Contains(err.Error(), `printed "hello\n", not a pid`) || len(f.started) != 0 {
		t.Errorf("Ensure = %v, want the holder's output refused before any start", err)
	}
}

func TestReleaseLeavesAScopeWithOthersPods(t *testing.T) {
	unified := t.TempDir()
	scope := filepath.Join(unified, Slice, Unit)
	os.MkdirAll(filepath.Join(scope, HolderLeaf), 0o755)
	os.MkdirAll(filepath.Join(scope, "other"), 0o755)
	f := &fakeSystemd{state: "active", cgroup: "/" + Slice + "/" + Unit, scopeDir: scope}
	os.MkdirAll(filepath.Join(unified, Slice, "another.scope"), 0o755)
	if stopped, err := Release(context.Background(), unified, f); stopped || err != nil || f.state != "active" {
		t.Errorf("Release with another tree in the scope = %v, %v; want it left running", stopped, err)
	}
	os.Remove(filepath.Join(scope, "other"))
	if stopped, err := Release(context.Background(), unified, f); !stopped || err != nil || f.state != "inactive" || slices.Contains(f.stopped, Slice) {
		t.Errorf("Release with only the holder left = %v, %v (stopped %v); want the scope stopped, not the slice another unit is in", stopped, err, f.stopped)
	}
	// Alone in the slice: the slice goes too.
	os.MkdirAll(filepath.Join(scope, HolderLeaf), 0o755)
	os.Remove(filepath.Join(unified, Slice, "another.scope"))
	f = &fakeSystemd{state: "active", cgroup: "/" + Slice + "/" + Unit, scopeDir: scope}
	if stopped, err := Release(context.Background(), unified, f); !stopped || err != nil || !slices.Equal(f.stopped, []string{Unit, Slice}) {
		t.Errorf("Release alone in the slice = %v, %v (stopped %v); want the scope and the slice stopped", stopped, err, f.stopped)
	}
}

// Two agents starting at once: the one whose start fails because the other made the scope uses
// that scope, and its own holder goes.
func TestEnsureLosesTheRaceToAnotherAgent(t *testing.T) {
	f := &fakeSystemd{state: "inactive", startErr: errors.New("Unit mqlet-pods.scope already exists.")}
	f.afterStart = func() { f.state, f.cgroup = "active", "/"+Slice+"/"+Unit }
	cg, err := Ensure(context.Background(), Options{Unified: t.TempDir(), Holder: holderCmd, Systemd: f})
	if err != nil || cg != "/"+Slice+"/"+Unit {
		t.Errorf("Ensure after losing the race = %q, %v; want the other agent's scope", cg, err)
	}
	pids, _ := property(f.started[0], "PIDs")
	t.Cleanup(func() { syscall.Kill(int(pids.([]uint32)[0]), syscall.SIGKILL) })
}
