package manifest

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/mqlet/mqlet/core/source"
)

// coalesceWindow is how long the directory has to be quiet after an event before Watch
// scans, so that the burst of events of one save (create temp, write, rename, chmod) causes
// one scan, and a file is not read between its truncation and its new content. Pod start
// latency is measured from "file written", so it is kept small; maxCoalesce bounds the wait
// when events keep coming.
const (
	coalesceWindow = 20 * time.Millisecond
	maxCoalesce    = 100 * time.Millisecond
)

// retryMin and retryMax bound the back-off between deliveries of a snapshot the consumer could
// not take (the agent's store write failed: a full disk frees up when the operator acts, so
// the wait stays short).
const (
	retryMin = time.Second
	retryMax = 10 * time.Second
)

// pollInterval is how often Watch looks for the directory while it does not exist and its
// parent cannot be watched either.
const pollInterval = time.Second

// Watch calls fn with the snapshot of an immediate Scan and then again whenever a change in
// the directory (create, write, remove, rename, chmod; events within ~20 ms coalesced) or
// the periodic resync (every resync; <= 0 disables it) produces a snapshot that differs from
// the last one delivered. If the directory does not exist, Watch watches its parent (and
// polls every second) until it appears; if it is removed, its pods go away and Watch waits
// for it again. If reading the directory fails, fn gets the pods of the last good snapshot
// and a Problem for the directory (Index -1). fn runs on Watch's goroutine.
//
// fn returns false when it could not take the snapshot (the agent could not store it): Watch then
// scans and calls fn again after retryMin, doubling up to retryMax, until fn takes one, so that
// a change made while the state dir was full is not lost (the directory, not the event, is what
// is delivered: a retry delivers what the directory holds by then).
//
// Watch returns nil when ctx is done, or an error if inotify is unavailable.
func (d *Dir) Watch(ctx context.Context, resync time.Duration, fn func(Snapshot) bool) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching manifest directory %s: %w", d.path, err)
	}
	defer w.Close()

	parent := filepath.Dir(d.path)
	watchingDir, watchingParent := false, false
	poll := time.NewTicker(pollInterval)
	defer poll.Stop()

	// ensureWatch watches the directory, or its parent while the directory is missing. The
	// parent is watched before the directory is tried again so that a directory created in
	// between is not missed.
	ensureWatch := func() {
		if watchingDir {
			return
		}
		if !watchingParent && parent != d.path {
			watchingParent = w.Add(parent) == nil
		}
		if w.Add(d.path) == nil {
			watchingDir = true
			if watchingParent {
				_ = w.Remove(parent)
				watchingParent = false
			}
			poll.Stop()
			return
		}
		poll.Reset(pollInterval)
	}

	var lastGood Snapshot
	var lastKey string
	var deliverUnless func(skip func(Snapshot) bool)
	delivered := false
	// retry fires while the last snapshot was not taken; retryWait is its current back-off.
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var retryWait time.Duration
	deliver := func() { deliverUnless(nil) }
	deliverUnless = func(skip func(Snapshot) bool) {
		snap, err := d.Scan()
		if err != nil {
			snap = Snapshot{Pods: copyPods(lastGood.Pods), Objects: copyObjects(lastGood.Objects), Problems: []Problem{{File: d.path, Index: -1, Err: err}}}
		} else {
			lastGood = Snapshot{Pods: copyPods(snap.Pods), Objects: copyObjects(snap.Objects)}
		}
		if skip != nil && skip(snap) {
			return
		}
		key := fingerprint(snap)
		if delivered && key == lastKey {
			return
		}
		delivered, lastKey = true, key
		if fn(snap) {
			retry.Stop()
			retryWait = 0
			return
		}
		// Not taken: the next scan is delivered whatever it holds, and one comes soon.
		delivered = false
		retryWait = min(max(2*retryWait, retryMin), retryMax)
		retry.Reset(retryWait)
	}

	var resyncC <-chan time.Time
	if resync > 0 {
		t := time.NewTicker(resync)
		defer t.Stop()
		resyncC = t.C
	}
	// coalesce fires coalesceWindow after the latest event, but no later than maxCoalesce
	// after the first one of a burst.
	coalesce := time.NewTimer(time.Hour)
	coalesce.Stop()
	defer coalesce.Stop()
	var burstStart time.Time
	schedule := func() {
		now := time.Now()
		if burstStart.IsZero() {
			burstStart = now
		}
		wait := min(coalesceWindow, maxCoalesce-now.Sub(burstStart))
		coalesce.Reset(max(wait, 0))
	}

	ensureWatch()
	deliver()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("watching manifest directory %s: event stream closed", d.path)
			}
			if ev.Name == d.path && ev.Op&(fsnotify.Remove|fsnotify.Rename) != 0 {
				// The directory itself went away (or was moved): its pods go away with it and
				// the watch has to start over on whatever appears at the path.
				_ = w.Remove(d.path)
				watchingDir = false
			} else if !watchingDir && ev.Name != d.path {
				continue // another entry of the parent directory
			}
			if ev.Op&fsnotify.Create != 0 && burstStart.IsZero() && IsManifestName(filepath.Base(ev.Name)) {
				// A file renamed into place is complete: read it now rather than after the
				// quiet window, which would otherwise be a fifth of a pod's start time. A file
				// created in place may still be half written; if it doesn't parse, wait for
				// the quiet window instead of reporting a problem that is about to go away.
				name := ev.Name
				deliverUnless(func(s Snapshot) bool {
					for _, p := range s.Problems {
						if p.File == name {
							return true
						}
					}
					return false
				})
			}
			schedule()
		case _, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("watching manifest directory %s: error stream closed", d.path)
			}
			// Most likely a queue overflow: events were lost, so look at everything again.
			schedule()
		case <-coalesce.C:
			burstStart = time.Time{}
			ensureWatch()
			deliver()
		case <-poll.C:
			ensureWatch()
			deliver()
		case <-resyncC:
			deliver()
		case <-retry.C:
			deliver()
		}
	}
}

// fingerprint identifies what a consumer of a snapshot can see, to skip repeating one.
func fingerprint(s Snapshot) string {
	var b strings.Builder
	for _, p := range s.Pods {
		b.WriteString(p.Ref().String())
		b.WriteByte(' ')
		b.WriteString(p.Sum)
		b.WriteString(" " + strconv.Itoa(p.Line) + " " + strconv.FormatBool(p.Stale) + "\n")
	}
	for _, o := range s.Objects {
		b.WriteString(o.Key() + " " + o.Ref().String() + " " + o.Sum + " " + strconv.Itoa(o.Line) + " " + strconv.FormatBool(o.Stale) + "\n")
	}
	for _, p := range s.Problems {
		b.WriteString(p.Error())
		b.WriteByte('\n')
	}
	return b.String()
}

func copyObjects(objs []Object) []Object {
	if objs == nil {
		return nil
	}
	out := make([]Object, len(objs))
	for i, o := range objs {
		out[i] = o.deepCopy()
	}
	return out
}

// OnObjects sets who receives the ConfigMaps and Secrets of every snapshot Run and Once deliver,
// before the pods that may use them are delivered; KeptFiles says whose objects stay as stored.
// Without it they are parsed and dropped. fn returns an error when it could not store them: Run
// then delivers the directory again (see Watch). Call it before Run.
func (d *Dir) OnObjects(fn func(Snapshot) error) { d.objects = fn }

func copyPods(pods []Pod) []Pod {
	if pods == nil {
		return nil
	}
	out := make([]Pod, len(pods))
	for i, p := range pods {
		out[i] = p
		out[i].Pod = p.Pod.DeepCopy()
	}
	return out
}

// Kind makes the directory a source.Source.
func (d *Dir) Kind() source.Kind { return source.File }

// Run delivers the directory to the agent: every snapshot Watch produces becomes a Resync (the
// directory is the whole set of file pods), with the problems as rejections. A problem with a whole
// file or a document that cannot be decoded marks its file Keep: the pods stored from it stay,
// because after a reboot nothing but the store remembers what the file held.
func (d *Dir) Run(ctx context.Context, deliver func(source.Change) source.Result) error {
	return d.Watch(ctx, resyncPeriod, func(s Snapshot) bool {
		objectsStored := true
		if d.objects != nil {
			objectsStored = d.objects(s) == nil
		}
		// The pods go to the agent even when an object failed to be stored: what was stored
		// is used, and the whole directory is delivered again until everything is.
		podsStored := deliver(s.Change()).Err == nil
		return objectsStored && podsStored
	})
}

// resyncPeriod re-reads the directory even without inotify events (a missed event, an NFS mount).
const resyncPeriod = 30 * time.Second

// Change is the snapshot as a Resync.
func (s Snapshot) Change() source.Change {
	c := source.Change{Op: source.Resync, Items: make([]source.Item, 0, len(s.Pods))}
	for _, p := range s.Pods {
		c.Items = append(c.Items, source.Item{Pod: p.Pod, Ref: p.Ref()})
	}
	for _, p := range s.Problems {
		r := source.Rejection{Ref: source.Ref{Kind: source.File, Origin: p.File, Doc: p.Index}, Line: p.Line,
			Reason: p.Err.Error(), Keep: !p.Duplicate}
		c.Rejections = append(c.Rejections, r)
	}
	return c
}

// Once reads the directory once (agent --once).
func (d *Dir) Once() (source.Change, error) {
	s, err := d.Scan()
	if err != nil {
		return source.Change{}, err
	}
	if d.objects != nil {
		if err := d.objects(s); err != nil {
			return source.Change{}, err
		}
	}
	return s.Change(), nil
}
