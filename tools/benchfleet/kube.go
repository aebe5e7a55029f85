package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/mqlet/mqlet/internal/kubetest"
)

// tracker follows one kind of object through an informer (a watch, no polling) and counts those
// for which ok holds. It notes the instant the count first reached each target asked for, on the
// informer's goroutine, so a waiter's wake-up latency is not part of a figure.
type tracker struct {
	ok func(obj any) bool
	// updates counts update events (a new resourceVersion): writes to the objects by anyone.
	updates atomic.Int64
	// onUpdate, when set, sees every update (what changed in the idle window).
	onUpdate atomic.Pointer[func(old, obj any)]

	mu      sync.Mutex
	state   map[string]bool // name -> ok
	n       int
	target  int
	reached time.Time
	changed chan struct{} // closed and replaced at every change of n
}

func newTracker(ok func(obj any) bool) *tracker {
	return &tracker{ok: ok, state: map[string]bool{}, changed: make(chan struct{})}
}

func (t *tracker) handlers() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { t.set(obj, false) },
		UpdateFunc: func(old, obj any) {
			if o, err1 := metav1Object(old); err1 == nil {
				if n, err2 := metav1Object(obj); err2 == nil && o.GetResourceVersion() != n.GetResourceVersion() {
					t.updates.Add(1)
					if f := t.onUpdate.Load(); f != nil {
						(*f)(old, obj)
					}
				}
			}
			t.set(obj, false)
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			t.set(obj, true)
		},
	}
}

func (t *tracker) set(obj any, deleted bool) {
	m, err := metaName(obj)
	if err != nil {
		return
	}
	ok := !deleted && t.ok(obj)
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.state[m]
	if deleted {
		delete(t.state, m)
	} else {
		t.state[m] = ok
	}
	if ok == was {
		return
	}
	if ok {
		t.n++
	} else {
		t.n--
	}
	if t.target > 0 && t.n >= t.target && t.reached.IsZero() {
		t.reached = time.Now()
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

func metaName(obj any) (string, error) {
	m, err := metav1Object(obj)
	if err != nil {
		return "", err
	}
	return m.GetNamespace() + "/" + m.GetName(), nil
}

func metav1Object(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T is not an API object", obj)
	}
	return m, nil
}

// expect notes the instant the count first reaches n, without waiting for it.
func (t *tracker) expect(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.target = n
	if t.n >= n && t.reached.IsZero() {
		t.reached = time.Now()
	}
}

// reachedAt is when the count reached the target expect or waitFor set (zero: not yet).
func (t *tracker) reachedAt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reached
}

// count is the number of objects for which ok holds now.
func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// okNames lists the names (namespace/name) of the objects for which ok holds, sorted.
func (t *tracker) okNames() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k, ok := range t.state {
		if ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// waitFor waits until at least n objects satisfy ok and returns the instant that first happened.
// While waiting it calls progress every 5 s with the count, and check (a process still alive?);
// an error from check ends the wait.
func (t *tracker) waitFor(ctx context.Context, n int, timeout time.Duration, what string, progress func(int), check func() error) (time.Time, error) {
	t.mu.Lock()
	t.target = n
	if t.n >= n && t.reached.IsZero() {
		t.reached = time.Now()
	}
	t.mu.Unlock()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		t.mu.Lock()
		got, reached, ch := t.n, t.reached, t.changed
		t.mu.Unlock()
		if !reached.IsZero() {
			return reached, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for %s: %w (%d of %d)", what, context.Cause(ctx), got, n)
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("waiting for %s: not reached within %s (%d of %d)", what, timeout, got, n)
		case <-tick.C:
			if progress != nil {
				progress(got)
			}
			if check != nil {
				if err := check(); err != nil {
					return time.Time{}, fmt.Errorf("waiting for %s (%d of %d): %w", what, got, n, err)
				}
			}
		case <-ch:
		}
	}
}

func nodeReady(obj any) bool {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeSchedulable: Ready and without the taints the node lifecycle controller manages for
// readiness (the TaintNodesByCondition admission plugin puts node.kubernetes.io/not-ready on every
// new Node; the controller removes it once it has seen the node Ready). Until then the scheduler
// places no pod there.
func nodeSchedulable(obj any) bool {
	n, ok := obj.(*corev1.Node)
	if !ok || !nodeReady(obj) {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	return true
}

func podRunning(obj any) bool {
	p, ok := obj.(*corev1.Pod)
	return ok && p.Status.Phase == corev1.PodRunning
}

// applyRBAC creates the namespace, then the ServiceAccount and RBAC of configs/bridge/rbac.yaml, so
// the bridge runs with exactly the rights it is deployed with.
func applyRBAC(ctx context.Context, cs kubernetes.Interface, path, namespace string) error {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	return kubetest.CreateManifests(ctx, cs, path)
}

// benchPod is pod i of the run, bound to node by spec.nodeName (no scheduler involved), as a user
// would write it: one container, the namespace's default ServiceAccount (its token volume is
// injected by the API and stripped by the bridge).
func benchPod(namespace, name, node, image string) *corev1.Pod {
	grace := int64(5)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app": "fleet-bench"}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:    "app",
				Image:   image,
				Command: []string{"sleep", "3600"},
			}},
		},
	}
}

// createPods creates the pods with workers concurrent clients, retrying what the apiserver
// refuses for load (429, 5xx, timeouts) with a short back-off. It returns when every create
// has returned, and the instant the last one did.
func createPods(ctx context.Context, cs kubernetes.Interface, pods []*corev1.Pod, workers int, timeout time.Duration) (time.Time, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	work := make(chan *corev1.Pod)
	var retries atomic.Int64
	var mu sync.Mutex
	var last time.Time
	var firstErr error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for p := range work {
				err := createOne(ctx, cs, p, &retries)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				if now := time.Now(); now.After(last) {
					last = now
				}
				mu.Unlock()
			}
		})
	}
feed:
	for _, p := range pods {
		select {
		case work <- p:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = fmt.Errorf("creating %d pods: %w", len(pods), context.Cause(ctx))
	}
	return last, retries.Load(), firstErr
}

func createOne(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, retries *atomic.Int64) error {
	backoff := 50 * time.Millisecond
	for {
		_, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		switch {
		case err == nil, apierrors.IsAlreadyExists(err):
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, errors.Join(err, context.Cause(ctx)))
		case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
			apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err):
			retries.Add(1)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff = min(2*backoff, 2*time.Second)
		default:
			return fmt.Errorf("create pod %s/%s on node %s: %w", p.Namespace, p.Name, p.Spec.NodeName, err)
		}
	}
}

// changedParts names the parts of two versions of an object that differ: metadata fields
// (managedFields apart), spec, and each status field, with the managers of the newer version.
func changedParts(old, obj any) string {
	parts := func(x any) map[string]string {
		out := map[string]string{}
		data, err := json.Marshal(x)
		if err != nil {
			return out
		}
		var m map[string]map[string]json.RawMessage
		if err := json.Unmarshal(data, &m); err != nil {
			return out
		}
		for section, fields := range m {
			for k, v := range fields {
				if k != "managedFields" && k != "resourceVersion" {
					out[section+"."+k] = string(v)
				}
			}
		}
		return out
	}
	a, b := parts(old), parts(obj)
	var diff []string
	for k, v := range b {
		if a[k] != v {
			diff = append(diff, k)
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			diff = append(diff, k+" (removed)")
		}
	}
	sort.Strings(diff)
	name, _ := metaName(obj)
	return fmt.Sprintf("%s: %s", name, strings.Join(diff, ", "))
}
