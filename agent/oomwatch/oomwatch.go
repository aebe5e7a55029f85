// Package oomwatch is the node's OOM watcher, kubelet's oomwatcher: it reads the kernel log
// (/dev/kmsg) and records a SystemOOM node event for each process the kernel's OOM killer kills
// outside the containers mqlet runs (a system daemon, a process in a systemd scope with
// MemoryMax). Kills inside pods are not repeated here: the pod's status and its OOMKilled
// container state already say so (agent/pod, from memory.events and the task exit).
package oomwatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/core/event"
)

// ReasonSystemOOM is kubelet's reason for the node event.
const ReasonSystemOOM = "SystemOOM"

// DefaultPath is the kernel's log device.
const DefaultPath = "/dev/kmsg"

// Options configure a Watcher.
type Options struct {
	NodeName string
	// Path is the kernel log to read, DefaultPath if empty (a FIFO in tests).
	Path string
	// PodsCgroup is the pods' top cgroup (below the hierarchy's root, e.g. /mqlet/mqlet): a
	// victim whose memory cgroup lies in it ran in a pod, and is not a system OOM.
	PodsCgroup string
	Events     event.Sink
	Log        *slog.Logger
}

// Watcher reads the kernel log. Create it with New, then Run it once.
type Watcher struct {
	o Options
}

// New makes a Watcher; nothing is read before Run.
func New(o Options) *Watcher {
	if o.Path == "" {
		o.Path = DefaultPath
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Watcher{o: o}
}

// Run reads the kernel log from its end (earlier kills are not this run's news, as cAdvisor's
// parser starts at the end too) until ctx ends; closing the log then ends the read it waits in,
// so no goroutine outlives the call. A log that cannot be opened (no /dev/kmsg in a container,
// no permission) is logged once and Run waits for ctx: the node works without the watcher.
func (w *Watcher) Run(ctx context.Context) error {
	// The kernel log is pollable: os.Open registers it with the runtime's poller, so Close
	// interrupts a Read that waits for the next record.
	f, err := os.Open(w.o.Path)
	if err != nil {
		w.o.Log.Warn("oom watcher: cannot read the kernel log; no SystemOOM events", "path", w.o.Path, "err", err)
		<-ctx.Done()
		return nil
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil && !errors.Is(err, syscall.ESPIPE) {
		w.o.Log.Debug("oom watcher: seek to the kernel log's end", "path", w.o.Path, "err", err)
	}
	w.o.Log.Info("oom watcher: reading the kernel log for OOM kills outside the pods", "path", w.o.Path, "podsCgroup", w.o.PodsCgroup)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	defer f.Close()
	w.read(ctx, f)
	return nil
}

// read handles records until the log is closed. /dev/kmsg returns one record per read (with its
// dictionary lines, which begin with a space); a FIFO may return several, or part of one.
func (w *Watcher) read(ctx context.Context, r io.Reader) {
	var p parser
	buf := make([]byte, 16<<10) // more than a record's 1 KiB text and its dictionary
	var partial []byte
	for {
		n, err := r.Read(buf)
		if n > 0 {
			data := append(partial, buf[:n]...)
			for {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					break
				}
				if k, ok := p.line(string(data[:i])); ok {
					w.record(k)
				}
				data = data[i+1:]
			}
			partial = append(partial[:0], data...)
		}
		switch {
		case err == nil:
		case errors.Is(err, syscall.EPIPE):
			// The ring buffer overwrote records before they were read: go on from the oldest
			// left (the kernel moved the reader's position).
			w.o.Log.Debug("oom watcher: kernel log records were overwritten before they were read")
		case errors.Is(err, io.EOF) && ctx.Err() == nil:
			// A FIFO whose writer closed: no more records will come.
			return
		default:
			if ctx.Err() == nil {
				w.o.Log.Warn("oom watcher: reading the kernel log failed; no more SystemOOM events", "path", w.o.Path, "err", err)
			}
			return
		}
	}
}

// Kill is one process the kernel's OOM killer killed.
type Kill struct {
	PID     int
	Process string
	// Cgroup is the victim's memory cgroup (task_memcg), empty on kernels whose log does not
	// say it (before 4.19).
	Cgroup string
}

func (w *Watcher) record(k Kill) {
	if w.inPods(k.Cgroup) {
		w.o.Log.Debug("oom watcher: OOM kill in a pod (its status reports it)", "pid", k.PID, "process", k.Process, "cgroup", k.Cgroup)
		return
	}
	msg := fmt.Sprintf("System OOM encountered, victim process: %s, pid: %d", k.Process, k.PID)
	if k.Cgroup != "" {
		msg += ", cgroup: " + k.Cgroup
	}
	w.o.Log.Warn("oom watcher: the kernel killed a process outside the pods for lack of memory", "reason", ReasonSystemOOM,
		"pid", k.PID, "process", k.Process, "cgroup", k.Cgroup)
	if w.o.Events != nil {
		w.o.Events.Emit(event.Event{Time: time.Now(), Type: event.Warning, Reason: ReasonSystemOOM, Message: msg,
			Object: event.NodeObject(w.o.NodeName)})
	}
}

// inPods reports whether cgroup is the pods' top cgroup or below it.
func (w *Watcher) inPods(cgroup string) bool {
	if w.o.PodsCgroup == "" || cgroup == "" {
		return false
	}
	base := path.Clean("/" + w.o.PodsCgroup)
	c := path.Clean("/" + cgroup)
	return c == base || strings.HasPrefix(c, base+"/")
}

// parser pairs the two lines the kernel logs for one kill: "oom-kill:...,task_memcg=<cgroup>,
// task=<name>,pid=<pid>,..." (Linux 4.19+), then "Out of memory: Killed process <pid> (<name>)
// ..." or "Memory cgroup out of memory: Killed process <pid> (<name>) ...". A kill is reported on
// the second line, which every kernel writes, with the cgroup of the first when its pid matches.
type parser struct {
	lastPID    int
	lastCgroup string
}

// line takes one line of the log ("<prio>,<seq>,<usec>,<flags>;<text>" for /dev/kmsg, or the bare
// text) and returns a kill when the line completes one.
func (p *parser) line(s string) (Kill, bool) {
	if strings.HasPrefix(s, " ") {
		return Kill{}, false // a record's dictionary line
	}
	if i := strings.IndexByte(s, ';'); i >= 0 && strings.Count(s[:i], ",") >= 3 {
		s = s[i+1:]
	}
	if rest, ok := strings.CutPrefix(s, "oom-kill:"); ok {
		p.lastPID, p.lastCgroup = 0, ""
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "task_memcg":
				p.lastCgroup = v
			case "pid":
				p.lastPID, _ = strconv.Atoi(v)
			}
		}
		return Kill{}, false
	}
	_, rest, ok := strings.Cut(s, "Killed process ")
	if !ok || !strings.Contains(s, "out of memory") && !strings.Contains(s, "Out of memory") {
		return Kill{}, false
	}
	pidStr, rest, ok := strings.Cut(rest, " (")
	if !ok {
		return Kill{}, false
	}
	name, _, ok := strings.Cut(rest, ")")
	pid, err := strconv.Atoi(pidStr)
	if !ok || err != nil {
		return Kill{}, false
	}
	k := Kill{PID: pid, Process: name}
	if pid == p.lastPID {
		k.Cgroup = p.lastCgroup
	}
	p.lastPID, p.lastCgroup = 0, ""
	return k, true
}
