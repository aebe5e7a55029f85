//go:build !nologind

package shutdown

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"
)

// These tests run the D-Bus client code against a real dbus-daemon (a private bus at a temporary
// address, not the system bus) on which the test itself plays systemd-logind and systemd: it
// hands out inhibitor locks as pipe ends and emits PrepareForShutdown. They test mqlet's side of
// the protocol, not logind.

// busProc is a private dbus-daemon this test started.
type busProc struct {
	addr string
	cmd  *exec.Cmd
	once sync.Once
}

// stop kills the daemon by its pid and waits for it.
func (b *busProc) stop() {
	b.once.Do(func() { b.cmd.Process.Kill(); b.cmd.Wait() })
}

// startBus runs a private dbus-daemon listening in dir and returns its address; it is stopped at
// cleanup.
func startBus(t *testing.T, dir string) string { return startBusProc(t, dir).addr }

func startBusProc(t *testing.T, dir string) *busProc {
	t.Helper()
	bin, err := exec.LookPath("dbus-daemon")
	if err != nil {
		if os.Getenv("MQLET_TEST_REQUIRE") == "1" {
			t.Fatalf("dbus-daemon unavailable: %v; install the dbus package (scripts/testenv.sh does)", err)
		}
		t.Skipf("dbus-daemon unavailable: %v; install the dbus package (scripts/testenv.sh does) to run this test", err)
	}
	conf := filepath.Join(dir, "bus.conf")
	os.WriteFile(conf, []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=`+filepath.Join(dir, "bus")+`</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
    <allow own="*"/>
  </policy>
</busconfig>
`), 0o644)
	cmd := exec.Command(bin, "--config-file="+conf, "--nofork", "--print-address=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &busProc{cmd: cmd}
	t.Cleanup(b.stop)
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("dbus-daemon gave no address: %v", err)
	}
	b.addr = strings.TrimSpace(addr)
	return b
}

// fakeLogind serves org.freedesktop.login1.Manager (Inhibit, InhibitDelayMaxUSec,
// PrepareForShutdown) and org.freedesktop.systemd1.Manager.KillUnit, which reloads the delay from
// the drop-in dir as logind would on SIGHUP (when reload is set).
type fakeLogind struct {
	t       *testing.T
	conn    *dbus.Conn
	props   *prop.Properties
	confDir string
	reload  bool

	mu       sync.Mutex
	inhibits []string              // "what who why mode" of each call
	locks    []*os.File            // read end of each lock handed out
	ours     []*os.File            // our copy of each write end, until the client holds its own
	released map[int]chan struct{} // closed when lock i's last write end is closed
	kills    []string
}

func newFakeLogind(t *testing.T, addr string, delay time.Duration, confDir string, reload bool) *fakeLogind {
	t.Helper()
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f := &fakeLogind{t: t, conn: conn, confDir: confDir, reload: reload, released: map[int]chan struct{}{}}
	if err := conn.Export(loginManager{f}, logindPath, logindInterface); err != nil {
		t.Fatal(err)
	}
	if err := conn.Export(systemdManagerObj{f}, systemdPath, systemdManager); err != nil {
		t.Fatal(err)
	}
	f.props, err = prop.Export(conn, logindPath, prop.Map{logindInterface: {
		"InhibitDelayMaxUSec": {Value: uint64(delay / time.Microsecond), Emit: prop.EmitFalse},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{logindService, systemdService} {
		if reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
			t.Fatalf("own %s: %v %v", name, reply, err)
		}
	}
	return f
}

type loginManager struct{ f *fakeLogind }

// Inhibit hands out the write end of a new pipe as the lock; the lock is released when every copy
// of that end is closed, which the read end sees as EOF.
func (m loginManager) Inhibit(what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	f := m.f
	r, w, err := os.Pipe()
	if err != nil {
		return 0, dbus.MakeFailedError(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	i := len(f.locks)
	f.inhibits = append(f.inhibits, strings.Join([]string{what, who, why, mode}, "|"))
	f.locks, f.ours = append(f.locks, r), append(f.ours, w)
	done := make(chan struct{})
	f.released[i] = done
	go func() { io.Copy(io.Discard, r); close(done) }()
	return dbus.UnixFD(w.Fd()), nil
}

type systemdManagerObj struct{ f *fakeLogind }

// KillUnit with SIGHUP to logind reloads InhibitDelayMaxSec from the drop-ins, as logind does.
func (m systemdManagerObj) KillUnit(unit, who string, sig int32) *dbus.Error {
	f := m.f
	f.mu.Lock()
	f.kills = append(f.kills, fmt.Sprintf("%s %s %d", unit, who, sig))
	f.mu.Unlock()
	if !f.reload || unit != "systemd-logind.service" || sig != int32(syscall.SIGHUP) {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(f.confDir, dropInName))
	if err != nil {
		return dbus.MakeFailedError(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "InhibitDelayMaxSec="); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return dbus.MakeFailedError(err)
			}
			f.props.SetMust(logindInterface, "InhibitDelayMaxUSec", n*1e6)
		}
	}
	return nil
}

func (f *fakeLogind) inhibitCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.inhibits...)
}

// handedOver waits until the client holds its own copy of lock i (the process has a third fd on
// the pipe: our read end, our write end, the client's), then closes our write end, so that only
// the client's copy keeps the lock.
func (f *fakeLogind) handedOver(i int) <-chan struct{} {
	f.t.Helper()
	waitUntil(f.t, "lock handed out", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.ours) > i
	})
	f.mu.Lock()
	w, done := f.ours[i], f.released[i]
	f.mu.Unlock()
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", w.Fd()))
	if err != nil {
		f.t.Fatal(err)
	}
	waitUntil(f.t, "the client holds the lock", func() bool { return fdsTo(target) >= 3 })
	w.Close()
	return done
}

// fdsTo counts this process's fds that point at target (e.g. "pipe:[123]").
func fdsTo(target string) int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == target {
			n++
		}
	}
	return n
}

func (f *fakeLogind) prepareForShutdown(active bool) {
	f.t.Helper()
	if err := f.conn.Emit(logindPath, logindInterface+".PrepareForShutdown", active); err != nil {
		f.t.Fatal(err)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// The whole logind protocol: the delay is raised to the grace period with a drop-in and a reload;
// a delay lock is held; PrepareForShutdown(true) stops the pods and only then releases the lock;
// PrepareForShutdown(false) calls the shutdown off and takes a new lock; stopping releases it.
func TestLogindInhibitorLock(t *testing.T) {
	dir := t.TempDir()
	addr := startBus(t, dir)
	confDir := filepath.Join(dir, "logind.conf.d")
	fake := newFakeLogind(t, addr, 5*time.Second, confDir, true)
	pods := &fakePods{hold: 300 * time.Millisecond}
	logs := &logRecorder{}
	stop := runManager(t, Options{GracePeriod: 30 * time.Second, CriticalGracePeriod: 10 * time.Second,
		BusAddress: addr, LogindConfDir: confDir, Log: slog.New(logs)}, pods)

	released := fake.handedOver(0)
	if got := fake.inhibitCalls(); len(got) != 1 || !strings.HasPrefix(got[0], "shutdown|mqlet|") || !strings.HasSuffix(got[0], "|delay") {
		t.Fatalf("Inhibit calls %q, want one delay lock on shutdown", got)
	}
	b, err := os.ReadFile(filepath.Join(confDir, dropInName))
	if err != nil || !strings.Contains(string(b), "[Login]\nInhibitDelayMaxSec=30\n") {
		t.Fatalf("drop-in: %q %v", b, err)
	}
	if logs.has("will not wait for the whole shutdownGracePeriod") {
		t.Errorf("warned although logind took the new delay:\n%s", logs)
	}
	if isClosed(released) {
		t.Fatalf("lock released before any shutdown")
	}

	fake.prepareForShutdown(true)
	<-released
	releasedAt := time.Now()
	calls, finished, _ := pods.snapshot()
	if len(calls) != 1 || calls[0] != [2]time.Duration{10 * time.Second, 20 * time.Second} {
		t.Fatalf("ShutdownPods calls %v, want one with critical 10s, others 20s", calls)
	}
	if finished[0].After(releasedAt) {
		t.Errorf("lock released at %v, before the pods stopped at %v", releasedAt, finished[0])
	}

	fake.prepareForShutdown(false)
	waitUntil(t, "shutdown called off", func() bool { _, _, c := pods.snapshot(); return c == 1 })
	second := fake.handedOver(1)
	stop()
	waitUntil(t, "second lock released when the manager stops", func() bool { return isClosed(second) })
	if calls, _, _ := pods.snapshot(); len(calls) != 1 {
		t.Errorf("ShutdownPods called %d times, want 1", len(calls))
	}
}

// When logind keeps a delay shorter than the grace period, the node says so clearly, and still
// holds what delay it can get.
func TestLogindShortDelayWarns(t *testing.T) {
	dir := t.TempDir()
	addr := startBus(t, dir)
	confDir := filepath.Join(dir, "logind.conf.d")
	fake := newFakeLogind(t, addr, 5*time.Second, confDir, false)
	logs := &logRecorder{}
	runManager(t, Options{GracePeriod: 30 * time.Second, CriticalGracePeriod: 10 * time.Second,
		BusAddress: addr, LogindConfDir: confDir, Log: slog.New(logs)}, &fakePods{})
	fake.handedOver(0)
	waitUntil(t, "warning about InhibitDelayMaxSec", func() bool {
		return logs.has("WARN systemd-logind will not wait for the whole shutdownGracePeriod") && logs.has("InhibitDelayMaxSec=5s")
	})
	fake.mu.Lock()
	kills := fake.kills
	fake.mu.Unlock()
	if len(kills) != 1 || kills[0] != "systemd-logind.service all 1" {
		t.Errorf("KillUnit calls %q, want one SIGHUP to logind", kills)
	}
}

// A bus that goes away is reconnected to, and a lock taken from the logind found there.
func TestLogindReconnects(t *testing.T) {
	dir := t.TempDir()
	first := startBusProc(t, dir)
	fake := newFakeLogind(t, first.addr, time.Minute, dir, false)
	runManager(t, Options{GracePeriod: 30 * time.Second, CriticalGracePeriod: 10 * time.Second,
		BusAddress: "unix:path=" + filepath.Join(dir, "bus"), LogindConfDir: dir, Log: slog.New(&logRecorder{})}, &fakePods{})
	fake.handedOver(0)
	first.stop()
	os.Remove(filepath.Join(dir, "bus"))
	second := startBusProc(t, dir)
	fake2 := newFakeLogind(t, second.addr, time.Minute, dir, false)
	fake2.handedOver(0)
}
