package oomwatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/event"
)

// Lines as Debian 12's 6.1 kernel writes them to /dev/kmsg for a kill in a systemd scope with
// MemoryMax, a kill in a pod's cgroup and a global OOM on an older kernel without oom-kill lines.
const (
	scopeKill = "6,1021,61234567,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0," +
		"oom_memcg=/system.slice/run-r1b2c.scope,task_memcg=/system.slice/run-r1b2c.scope,task=sh,pid=4242,uid=0\n" +
		"3,1022,61234600,-;Memory cgroup out of memory: Killed process 4242 (sh) total-vm:35372kB, anon-rss:20220kB, " +
		"file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:92kB oom_score_adj:0\n"
	podKill = "6,1030,71234567,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=abc,mems_allowed=0," +
		"oom_memcg=/mqlet/mqlet/burstable/pod1234,task_memcg=/mqlet/mqlet/burstable/pod1234/ctr,task=app,pid=5151,uid=0\n" +
		" SUBSYSTEM=memory\n" +
		"3,1031,71234600,-;Memory cgroup out of memory: Killed process 5151 (app) total-vm:1kB\n"
	oldKernelKill = "3,99,81234567,-;Out of memory: Killed process 777 (java worker) total-vm:1kB, anon-rss:1kB\n"
)

type sink struct {
	mu sync.Mutex
	ev []event.Event
	ch chan struct{}
}

func (s *sink) Emit(e event.Event) {
	s.mu.Lock()
	s.ev = append(s.ev, e)
	s.mu.Unlock()
	s.ch <- struct{}{}
}

// The watcher reports kills outside the pods as kubelet's SystemOOM node event (with the cgroup),
// not the pod's, and ends when its context does although the log stays open.
func TestSystemOOMFromKernelLog(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "kmsg")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Held open for writing (and reading, so this open does not wait for a reader) for the whole
	// test: the log never reaches its end, like /dev/kmsg.
	wr, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wr.Close()
	s := &sink{ch: make(chan struct{}, 10)}
	w := New(Options{NodeName: "edge-1", Path: fifo, PodsCgroup: "/mqlet/mqlet", Events: s, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()

	for _, rec := range []string{podKill, scopeKill, oldKernelKill} {
		if _, err := wr.WriteString(rec); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case <-s.ch:
		case <-time.After(10 * time.Second): // a bound on a hang, not on speed
			t.Fatalf("events so far: %+v", s.ev)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	want := []string{
		"System OOM encountered, victim process: sh, pid: 4242, cgroup: /system.slice/run-r1b2c.scope",
		"System OOM encountered, victim process: java worker, pid: 777",
	}
	if len(s.ev) != len(want) {
		t.Fatalf("events %+v, want %d (none for the pod's kill)", s.ev, len(want))
	}
	for i, e := range s.ev {
		if e.Message != want[i] || e.Reason != ReasonSystemOOM || e.Type != event.Warning || e.Object != event.NodeObject("edge-1") {
			t.Errorf("event %d = %+v, want Warning SystemOOM on node edge-1 %q", i, e, want[i])
		}
	}
}

// A kernel log that cannot be opened leaves the node without the watcher, not stuck.
func TestUnreadableLogWaitsForStop(t *testing.T) {
	w := New(Options{Path: filepath.Join(t.TempDir(), "absent"), Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Run(ctx)
}
