package e2e

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Under the shipped unit (Type=notify, WatchdogSec) systemd hears READY=1 only once the stored pods
// are restored and the local API answers (so `systemctl start mqlet && mqlet pods` works), then
// WATCHDOG=1 at half of $WATCHDOG_USEC from the agent's main loop, and STOPPING=1 on SIGTERM. The
// test stands in for systemd with its own notify socket; the guest lane (scripts/vm/guest.sh)
// checks the same under real systemd.
func TestSystemdNotifyReadyAndWatchdog(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	sockPath := filepath.Join(h.dir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	msgs := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msg := string(buf[:n])
			// What the agent's API says at the moment READY arrives.
			if strings.Contains(msg, "READY=1") {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := h.client.ListPods(ctx, ""); err != nil {
					msg += "\n(API not answering at READY: " + err.Error() + ")"
				}
				cancel()
			}
			msgs <- msg
		}
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("notify socket closed while waiting for %s", what)
			}
			return m
		case <-time.After(60 * time.Second): // a bound on a hang, not a speed check
			t.Fatalf("no %s on the notify socket within 60s\nagent log:\n%s", what, h.agentLog)
		}
		return ""
	}
	// 1 s: WATCHDOG=1 every 0.5 s.
	// RUNTIME_DIRECTORY: a failed start would count itself there, not in the host's /run/mqlet.
	h.agentEnv = []string{"NOTIFY_SOCKET=" + sockPath, "WATCHDOG_USEC=1000000", "RUNTIME_DIRECTORY=" + filepath.Join(h.dir, "run")}
	h.startAgent()

	ready := next("READY=1")
	if !strings.HasPrefix(ready, "READY=1\nSTATUS=") || strings.Contains(ready, "API not answering") {
		t.Fatalf("first message %q, want READY=1 with a STATUS, sent once the API answers", ready)
	}
	h.waitPod("web", "running", allRunning)
	for i := range 3 {
		if m := next("WATCHDOG=1"); m != "WATCHDOG=1" {
			t.Fatalf("message %d after READY is %q, want WATCHDOG=1", i+1, m)
		}
	}
	h.stopAgent()
	for {
		m := next("STOPPING=1")
		if strings.HasPrefix(m, "STOPPING=1") {
			break
		}
		if m != "WATCHDOG=1" {
			t.Fatalf("unexpected message %q before STOPPING=1", m)
		}
	}
}
