package probe

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	v1 "k8s.io/api/core/v1"
)

// Kind of probe.
type Kind uint8

const (
	Liveness Kind = iota
	Readiness
	Startup
)

func (k Kind) String() string {
	switch k {
	case Liveness:
		return "Liveness"
	case Readiness:
		return "Readiness"
	}
	return "Startup"
}

// spec is the container's probe of this kind, or nil.
func (k Kind) spec(c *v1.Container) *v1.Probe {
	switch k {
	case Liveness:
		return c.LivenessProbe
	case Readiness:
		return c.ReadinessProbe
	}
	return c.StartupProbe
}

var kinds = [...]Kind{Startup, Liveness, Readiness}

// Running is one running container attempt whose probes should run.
type Running struct {
	Target    Target    // Container and ContainerID set
	StartedAt time.Time // initialDelaySeconds counts from here
}

// Events receives what the probes of a pod have to say (kubelet's Unhealthy and ProbeWarning
// events). It must not block.
type Events func(container string, warning bool, reason, message string)

// Set runs the probes of one pod, each on a timer of its own: between attempts a probe holds no
// goroutine (nor its stack); an attempt runs on the goroutine its timer starts, so a probe has at
// most one, and one pod's slow probe never delays another's. A probe ends when its container
// attempt is no longer running, when the pod goes, or on Stop (the pod worker stops them when the
// agent stops). Results are read by the pod's worker; a change nudges it (onChange must not block).
type Set struct {
	p        *Prober
	ctx      context.Context
	onChange func()
	events   Events
	log      *slog.Logger
	wg       sync.WaitGroup

	mu      sync.Mutex
	workers map[key]*worker // guarded by mu
}

type key struct {
	container string
	kind      Kind
}

// worker is one probe of one container attempt.
type worker struct {
	key
	id        string
	spec      *v1.Probe
	startedAt time.Time
	ctx       context.Context
	cancel    context.CancelFunc
	timer     *time.Timer

	// guarded by Set.mu
	result Result // kubelet's initial values: liveness success, readiness failure, startup unknown
	output string

	mu      sync.Mutex // guards the three below; never held over an attempt
	running bool       // an attempt is under way
	stopped bool
	done    bool // finished: counted out of Set.wg, namespace file closed

	// owned by the attempt under way (one at a time)
	target Target
	last   Result
	run    int // consecutive attempts with result last
}

// NewSet makes the probe set of one pod; its probes end when ctx does or on Stop.
func (p *Prober) NewSet(ctx context.Context, onChange func(), events Events, log *slog.Logger) *Set {
	if log == nil {
		log = slog.Default()
	}
	return &Set{p: p, ctx: ctx, onChange: onChange, events: events, log: log, workers: map[key]*worker{}}
}

// Sync makes the running probes those of running: probes of attempts that are no longer running
// stop, new attempts' probes start (a restarted container starts over: initial delay, thresholds,
// startup). Cheap when nothing changed; call it after every pod sync.
func (s *Set) Sync(running []Running) {
	if s == nil {
		return
	}
	want := map[key]bool{}
	var stop []*worker
	s.mu.Lock()
	defer func() {
		s.mu.Unlock()
		for _, w := range stop {
			s.stop(w)
		}
	}()
	for _, r := range running {
		c := r.Target.Container
		for _, k := range kinds {
			spec := k.spec(c)
			if spec == nil {
				continue
			}
			kk := key{c.Name, k}
			want[kk] = true
			if w, ok := s.workers[kk]; ok {
				if w.id == r.Target.ContainerID && equality.Semantic.DeepEqual(w.spec, spec) {
					continue
				}
				stop = append(stop, w)
			}
			s.start(kk, spec, r)
		}
	}
	for kk, w := range s.workers {
		if !want[kk] {
			stop = append(stop, w)
			delete(s.workers, kk)
		}
	}
}

// start runs a new probe worker (s.mu held).
func (s *Set) start(kk key, spec *v1.Probe, r Running) {
	ctx, cancel := context.WithCancel(s.ctx)
	w := &worker{key: kk, id: r.Target.ContainerID, spec: spec.DeepCopy(), target: r.Target, startedAt: r.StartedAt, ctx: ctx, cancel: cancel}
	w.target.cache = &cache{}
	switch kk.kind {
	case Liveness:
		w.result = Success
	case Readiness:
		w.result = Failure
	}
	s.workers[kk] = w
	s.wg.Add(1)
	first := time.Until(w.startedAt.Add(time.Duration(w.spec.InitialDelaySeconds) * time.Second))
	w.mu.Lock() // the timer may fire before it is stored; its attempt takes w.mu first
	w.timer = time.AfterFunc(max(first, 0), func() { s.attempt(w) })
	w.mu.Unlock()
}

// stop ends a probe: at once if it is between attempts, else when its attempt returns (the attempt's
// context is cancelled; a connection waits at most for its timeout).
func (s *Set) stop(w *worker) {
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	// A timer that already fired has an attempt on its way, which will see stopped.
	if !w.running && !w.done && w.timer.Stop() {
		s.finish(w)
	}
}

// finish counts the probe out (w.mu held); once only.
func (s *Set) finish(w *worker) {
	if w.done {
		return
	}
	w.done = true
	if w.target.ns != nil {
		w.target.ns.Close()
	}
	s.wg.Done()
}

// Stop ends every probe of the pod and waits for attempts under way.
func (s *Set) Stop() {
	if s == nil {
		return
	}
	s.Sync(nil)
	s.wg.Wait()
}

// Status is what the probes say of container c's attempt id: started (its startup probe passed,
// or it has none) and ready (started, and its readiness probe passed or it has none). A probe not
// yet run for this attempt counts as not passed.
func (s *Set) Status(c *v1.Container, id string) (started, ready bool) {
	started = c.StartupProbe == nil || s.result(c.Name, Startup, id) == Success
	ready = started && (c.ReadinessProbe == nil || s.result(c.Name, Readiness, id) == Success)
	return started, ready
}

func (s *Set) result(name string, k Kind, id string) Result {
	if s == nil {
		return Unknown
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.workers[key{name, k}]; ok && w.id == id {
		return w.result
	}
	return Unknown
}

// Failed reports whether the liveness or startup probe of container name's attempt id has failed
// past its threshold, so the container must be killed, with which probe, its output, and the
// probe's own termination grace period if it sets one.
func (s *Set) Failed(name, id string) (k Kind, output string, grace *int64, failed bool) {
	if s == nil {
		return 0, "", nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range [...]Kind{Startup, Liveness} {
		if w, ok := s.workers[key{name, k}]; ok && w.id == id && w.result == Failure {
			return k, w.output, w.spec.TerminationGracePeriodSeconds, true
		}
	}
	return 0, "", nil, false
}

// started reports whether the container attempt has passed its startup probe, or has none:
// liveness and readiness wait for it.
func (s *Set) started(name, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.workers[key{name, Startup}]
	return !ok || (w.id == id && w.result == Success)
}

// set records a result that crossed its threshold and nudges the worker if it changed.
func (s *Set) set(w *worker, r Result, output string) {
	s.mu.Lock()
	changed := w.result != r
	w.result, w.output = r, output
	s.mu.Unlock()
	if changed {
		s.log.Info("probe result changed", "container", w.container, "probe", w.kind.String(), "result", r.String())
		s.onChange()
	}
}

// Kubernetes' defaults, for probes that did not come through an API server that set them.
func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

func threshold(v, def int32) int {
	if v <= 0 {
		return int(def)
	}
	return int(v)
}

// untilTick is how long from now to the next probe: a multiple of period (since the Unix epoch),
// at least half a period away. Probes run on these ticks rather than each on its own phase: all
// probes of the node with the same period then wake the agent together, once per period, instead
// of each waking it on its own, and waking an idle process is much of what a cheap probe costs.
// Once on the ticks, probes are a period apart; the first (at the end of the initial delay) is
// followed by the next within half a period to a period and a half, so thresholds keep their
// meaning (kubelet, too, shifts a probe's phase by up to a period when it restarts).
func untilTick(now time.Time, period time.Duration) time.Duration {
	d := period - time.Duration(now.UnixNano()%int64(period))
	if d < period/2 {
		d += period
	}
	return d
}

// attempt runs one attempt of probe w, records it, and sets the timer for the next. A liveness or
// startup failure, and a startup success, are final for the container attempt (kubelet holds them
// until the container is replaced): no next attempt then.
func (s *Set) attempt(w *worker) {
	w.mu.Lock()
	if w.stopped || w.ctx.Err() != nil {
		s.finish(w)
		w.mu.Unlock()
		return
	}
	w.running = true
	w.mu.Unlock()

	again := s.probe(w)

	w.mu.Lock()
	defer w.mu.Unlock()
	w.running = false
	if w.stopped || !again || w.ctx.Err() != nil {
		s.finish(w)
		return
	}
	w.timer.Reset(untilTick(time.Now(), seconds(w.spec.PeriodSeconds, 10)))
}

// probe runs the probe once, unless it waits for the startup probe, and reports whether to go on.
func (s *Set) probe(w *worker) bool {
	if w.kind != Startup && !s.started(w.container, w.id) {
		return true
	}
	if w.target.NetNS != "" && w.target.ns == nil {
		// Held open while the probe lives, so each attempt does not look the namespace up again.
		if f, err := os.Open(w.target.NetNS); err == nil {
			w.target.ns = f
		}
	}
	res, out, err := s.p.Run(w.ctx, w.target, &w.spec.ProbeHandler, seconds(w.spec.TimeoutSeconds, 1))
	if w.ctx.Err() != nil {
		return false // stopped mid-attempt: that is no result
	}
	if err != nil {
		// A probe that cannot be run says nothing about the container; kubelet does not count it.
		s.events(w.container, true, "Unhealthy", fmt.Sprintf("%s probe errored: %v", w.kind, err))
		return true
	}
	switch res {
	case Warning:
		s.events(w.container, true, "ProbeWarning", fmt.Sprintf("%s probe warning: %s", w.kind, out))
		res = Success
	case Failure:
		s.events(w.container, true, "Unhealthy", fmt.Sprintf("%s probe failed: %s", w.kind, out))
	}
	if res == w.last {
		w.run++
	} else {
		w.last, w.run = res, 1
	}
	success := threshold(w.spec.SuccessThreshold, 1)
	if w.kind != Readiness {
		success = 1 // the API allows nothing else for liveness and startup
	}
	if res == Failure && w.run >= threshold(w.spec.FailureThreshold, 3) || res == Success && w.run >= success {
		s.set(w, res, out)
		if w.kind == Startup && res == Success || w.kind != Readiness && res == Failure {
			return false
		}
	}
	return true
}
