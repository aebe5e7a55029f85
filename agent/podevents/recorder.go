// Package podevents keeps what happened to each pod the way kubelet's event recorder leaves it in
// the API server, for `mqlet describe pod` and the local API: a bounded list of events per pod,
// deduplicated (the same event again raises its count and last time), with a burst of similar
// events folded into one "combined" event, kept in the state store across agent restarts and
// removed with the pod. It also throttles, per pod, what goes on to the control plane, as
// kubelet's spam filter throttles what reaches the API server.
//
// Recording never does I/O: events change the in-memory lists under a short lock, and a flusher
// writes the changed lists in one store transaction a moment later (FlushDelay), so a burst of
// events costs one fsync, not one each, and event routing and the API never wait for the disk.
// Events recorded within FlushDelay of a crash (kill -9, power loss) are lost; an orderly stop
// flushes.
package podevents

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Bounds and kubelet's correlator settings (client-go tools/record).
const (
	// MaxPerPod is how many distinct events a pod keeps; the least recently seen goes first.
	MaxPerPod = 50
	// MaxTotal bounds the events of all pods together (memory and the state file); beyond it the
	// least recently seen event of any pod goes.
	MaxTotal = 2000
	// aggregateAfter distinct messages with the same reason within aggregateWindow make further
	// ones one "combined" event (kubelet: 10 in 10 minutes).
	aggregateAfter  = 10
	aggregateWindow = 10 * time.Minute
	combinedPrefix  = "(combined from similar events): "
	// spamBurst events per pod go on to the control plane at once, then one per spamRefill
	// (kubelet: 25, then one every 5 minutes). The local list counts every one.
	spamBurst  = 25
	spamRefill = 5 * time.Minute
	// maxMessage bounds a message, as the API server bounds an event's note (1 KiB).
	maxMessage = 1024

	// DefaultFlushDelay is how long a burst may gather before it is written.
	DefaultFlushDelay = time.Second
	// DefaultPruneEvery is how often events of pods the agent no longer has are dropped.
	DefaultPruneEvery = time.Minute

	// Component is what the events' source names (kubelet's is "kubelet").
	Component = "mqlet"
)

// Store is the part of store.State the recorder uses.
type Store interface {
	UpdateEvents(put []store.PodEvents, del []types.UID) error
	ListEvents() ([]store.PodEvents, []store.RecordError, error)
}

// Options configure a Recorder.
type Options struct {
	Store Store
	// Node is the node's name, the events' source host.
	Node string
	Log  *slog.Logger
	// FlushDelay and PruneEvery default to DefaultFlushDelay and DefaultPruneEvery.
	FlushDelay time.Duration
	PruneEvery time.Duration
	// Now is the clock for events that carry no time and for the throttle; time.Now when nil.
	Now func() time.Time
}

// Recorder keeps the pods' events. Make it with New, fill it with Load, run its flusher with Run.
type Recorder struct {
	o    Options
	kick chan struct{}

	// flushMu serialises flushes, so two writes of one pod's list cannot land out of order.
	flushMu sync.Mutex

	// mu guards what follows; it is held for map and slice work only, never across I/O.
	mu      sync.Mutex
	pods    map[types.UID]*podLog
	total   int
	pending map[types.UID]bool // pods whose stored list is stale: written (or deleted) by the next flush
}

// podLog is one pod's events, least recently seen first, and the correlator state behind them.
type podLog struct {
	namespace, name string
	events          []store.EventRecord
	similar         map[similarKey]*similar
	tokens          float64 // the control-plane throttle's bucket
	refilled        time.Time
}

// similarKey groups events that differ only by message (kubelet's aggregate key).
type similarKey struct{ typ, reason, source string }

// similar is the set of distinct messages seen for one similarKey within aggregateWindow.
type similar struct {
	messages map[string]bool
	last     time.Time
}

// New returns an empty recorder; see Load.
func New(o Options) *Recorder {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.FlushDelay <= 0 {
		o.FlushDelay = DefaultFlushDelay
	}
	if o.PruneEvery <= 0 {
		o.PruneEvery = DefaultPruneEvery
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Recorder{o: o, kick: make(chan struct{}, 1), pods: map[types.UID]*podLog{}, pending: map[types.UID]bool{}}
}

// Load reads the stored events (call it once, before events are recorded). An unreadable record
// is logged and skipped; it is replaced when its pod's next event is flushed.
func (r *Recorder) Load() error {
	lists, bad, err := r.o.Store.ListEvents()
	if err != nil {
		return err
	}
	for _, e := range bad {
		r.o.Log.Warn("state store: skipping unreadable pod events", "err", e)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range lists {
		evs := slices.Clone(p.Events)
		slices.SortStableFunc(evs, func(a, b store.EventRecord) int { return a.LastTime.Compare(b.LastTime) })
		if len(evs) > MaxPerPod {
			evs = evs[len(evs)-MaxPerPod:]
			r.pending[p.UID] = true
		}
		r.pods[p.UID] = &podLog{namespace: p.Namespace, name: p.Name, events: evs, similar: map[similarKey]*similar{},
			tokens: spamBurst, refilled: r.o.Now()}
		r.total += len(evs)
	}
	r.trimTotalLocked()
	return nil
}

// Record takes one event. Events about a pod with a UID are kept; every event reports whether it
// should go on to the control plane (false once a pod's events exceed the throttle). It does no
// I/O and never blocks for long, so it may be called from any path.
func (r *Recorder) Record(e event.Event) (forward bool) {
	if e.Object.Kind != event.KindPod || e.Object.UID == "" {
		return true
	}
	now := e.Time
	if now.IsZero() {
		now = r.o.Now()
	}
	msg := truncate(e.Message)
	uid := e.Object.UID

	r.mu.Lock()
	p := r.pods[uid]
	if p == nil {
		p = &podLog{namespace: e.Object.Namespace, name: e.Object.Name, similar: map[similarKey]*similar{},
			tokens: spamBurst, refilled: r.o.Now()}
		r.pods[uid] = p
	}
	combined := p.aggregate(similarKey{string(e.Type), e.Reason, e.Source}, msg, now)
	if combined {
		msg = combinedPrefix + msg
	}
	r.observeLocked(p, e, msg, combined, now)
	r.pending[uid] = true
	forward = p.allow(r.o.Now())
	r.mu.Unlock()

	select {
	case r.kick <- struct{}{}:
	default:
	}
	return forward
}

// aggregate notes msg under k and reports whether the event is now one of a burst of similar ones
// (aggregateAfter distinct messages within aggregateWindow), to be folded into a combined event.
func (p *podLog) aggregate(k similarKey, msg string, now time.Time) bool {
	s := p.similar[k]
	if s == nil || now.Sub(s.last) > aggregateWindow {
		s = &similar{messages: map[string]bool{}}
		p.similar[k] = s
	}
	s.messages[msg] = true
	s.last = now
	if len(s.messages) < aggregateAfter {
		return false
	}
	// The set stays at its limit: one other message makes room, as kubelet's does.
	for m := range s.messages {
		if m != msg {
			delete(s.messages, m)
			break
		}
	}
	return true
}

// observeLocked counts e into p: the same event again (or the combined event of its kind) gets
// count+1, the new message and last time, and moves to the end; a new one is added, and the
// least recently seen goes when the pod or the node holds too many.
func (r *Recorder) observeLocked(p *podLog, e event.Event, msg string, combined bool, now time.Time) {
	for i := range p.events {
		x := &p.events[i]
		if !sameEvent(x, e, msg, combined) {
			continue
		}
		x.Count++
		x.Message = msg
		if now.After(x.LastTime) {
			x.LastTime = now
		}
		moved := *x
		p.events = append(slices.Delete(p.events, i, i+1), moved)
		return
	}
	p.events = append(p.events, store.EventRecord{Type: string(e.Type), Reason: e.Reason, Message: msg, Source: e.Source,
		FieldPath: e.Object.FieldPath, Count: 1, FirstTime: now, LastTime: now})
	r.total++
	if len(p.events) > MaxPerPod {
		p.events = slices.Delete(p.events, 0, 1)
		r.total--
	}
	r.trimTotalLocked()
}

// sameEvent is kubelet's correlation key: the same type, reason, source and container, and the
// same message; a combined event matches any event of its kind whatever the container.
func sameEvent(x *store.EventRecord, e event.Event, msg string, combined bool) bool {
	if x.Type != string(e.Type) || x.Reason != e.Reason || x.Source != e.Source {
		return false
	}
	if combined {
		return isCombined(x.Message)
	}
	return x.FieldPath == e.Object.FieldPath && x.Message == msg
}

func isCombined(msg string) bool {
	return len(msg) >= len(combinedPrefix) && msg[:len(combinedPrefix)] == combinedPrefix
}

// trimTotalLocked drops the least recently seen events of any pod until the node holds MaxTotal.
func (r *Recorder) trimTotalLocked() {
	for r.total > MaxTotal {
		var oldest types.UID
		var at time.Time
		for uid, p := range r.pods {
			if len(p.events) > 0 && (oldest == "" || p.events[0].LastTime.Before(at)) {
				oldest, at = uid, p.events[0].LastTime
			}
		}
		if oldest == "" {
			return
		}
		p := r.pods[oldest]
		p.events = slices.Delete(p.events, 0, 1)
		r.total--
		r.pending[oldest] = true
	}
}

// allow is the control-plane throttle: a token bucket of spamBurst, refilled by one every
// spamRefill.
func (p *podLog) allow(now time.Time) bool {
	if d := now.Sub(p.refilled); d > 0 {
		p.tokens = min(spamBurst, p.tokens+float64(d)/float64(spamRefill))
		p.refilled = now
	}
	if p.tokens < 1 {
		return false
	}
	p.tokens--
	return true
}

// Forget drops the events of a pod that is gone; the next flush deletes its stored list.
func (r *Recorder) Forget(uid types.UID) {
	if uid == "" {
		return
	}
	r.mu.Lock()
	if p := r.pods[uid]; p != nil {
		r.total -= len(p.events)
		delete(r.pods, uid)
	}
	r.pending[uid] = true
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Prune forgets the pods not in keep whose latest event is older than seenBefore: pods deleted
// while the agent was down, or stragglers recorded after a pod was forgotten. seenBefore is when
// keep was read, so that a pod that appeared since keeps its first events.
func (r *Recorder) Prune(keep map[types.UID]bool, seenBefore time.Time) {
	var drop []types.UID
	r.mu.Lock()
	for uid, p := range r.pods {
		if keep[uid] {
			continue
		}
		if n := len(p.events); n == 0 || p.events[n-1].LastTime.Before(seenBefore) {
			drop = append(drop, uid)
		}
	}
	r.mu.Unlock()
	for _, uid := range drop {
		r.o.Log.Info("dropping events of a pod the agent no longer has", "uid", uid)
		r.Forget(uid)
	}
}

// Flush writes every changed list (and deletes the forgotten ones) in one store transaction. On
// failure the lists stay pending for the next flush.
func (r *Recorder) Flush() error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	var put []store.PodEvents
	var del []types.UID
	r.mu.Lock()
	for uid := range r.pending {
		if p := r.pods[uid]; p != nil && len(p.events) > 0 {
			put = append(put, store.PodEvents{UID: uid, Namespace: p.namespace, Name: p.name, Events: slices.Clone(p.events)})
		} else {
			del = append(del, uid)
		}
	}
	clear(r.pending)
	r.mu.Unlock()
	if len(put) == 0 && len(del) == 0 {
		return nil
	}
	err := r.o.Store.UpdateEvents(put, del)
	if err != nil {
		r.mu.Lock()
		for _, p := range put {
			r.pending[p.UID] = true
		}
		for _, uid := range del {
			r.pending[uid] = true
		}
		r.mu.Unlock()
	}
	return err
}

// Run flushes a moment after events arrive and prunes every PruneEvery until ctx ends, then
// flushes once more. alive returns the UIDs of the pods the agent has, and false while it cannot
// tell yet (before its sources were read); nil means no pruning.
func (r *Recorder) Run(ctx context.Context, alive func() (map[types.UID]bool, bool)) error {
	prune := time.NewTicker(r.o.PruneEvery)
	defer prune.Stop()
	defer r.flushLogged()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
			t := time.NewTimer(r.o.FlushDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			r.flushLogged()
		case <-prune.C:
			if alive == nil {
				continue
			}
			at := r.o.Now()
			if keep, ok := alive(); ok {
				r.Prune(keep, at)
			}
		}
	}
}

func (r *Recorder) flushLogged() {
	if err := r.Flush(); err != nil {
		r.o.Log.Error("store pod events; retrying with the next events", "err", err)
	}
}

// Events returns the pod's events, least recently seen first, as Kubernetes Events.
func (r *Recorder) Events(uid types.UID) []v1.Event {
	r.mu.Lock()
	p := r.pods[uid]
	var evs []store.EventRecord
	var ns, name string
	if p != nil {
		evs, ns, name = slices.Clone(p.events), p.namespace, p.name
	}
	r.mu.Unlock()
	out := make([]v1.Event, 0, len(evs))
	for _, e := range evs {
		out = append(out, toV1(uid, ns, name, r.o.Node, e))
	}
	return out
}

// truncate bounds a message to maxMessage bytes without splitting a character.
func truncate(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
