package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/typeurl/v2"
)

// probeTopic is published by the recorder itself to learn when its subscription is live: containerd's
// Subscribe returns before the server has registered the stream, and an event published in between
// would be lost.
const probeTopic = "/bench/probe"

// event is one containerd event of the bench namespace as the harness saw it.
type event struct {
	Topic       string
	ContainerID string
	Received    time.Time // when the harness read it: what the figures use
	Stamped     time.Time // containerd's own timestamp, for the breakdown of a pod start
}

// recorder keeps every container lifecycle event of one namespace, across containerd restarts.
type recorder struct {
	ns string

	mu      sync.Mutex
	events  []event
	changed chan struct{} // closed and replaced on every new event
	probes  int
}

func newRecorder(ns string) *recorder {
	return &recorder{ns: ns, changed: make(chan struct{})}
}

// attach subscribes to the namespace's events on client and returns once the subscription is
// proven live by a probe event coming back. The subscription ends with ctx or when containerd goes.
func (r *recorder) attach(ctx context.Context, client *containerd.Client) error {
	ch, errs := client.Subscribe(ctx, fmt.Sprintf("namespace==%q", r.ns))
	r.mu.Lock()
	want := r.probes + 1
	r.mu.Unlock()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-errs:
				return
			case env := <-ch:
				if env != nil {
					r.add(env.Topic, env.Event, env.Timestamp)
				}
			}
		}
	}()

	nctx := namespaces.WithNamespace(ctx, r.ns)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := client.EventService().Publish(nctx, probeTopic, &apievents.TaskStart{ContainerID: "bench-probe"}); err != nil {
			return fmt.Errorf("publish probe event to containerd: %w", err)
		}
		r.mu.Lock()
		got, changed := r.probes, r.changed
		r.mu.Unlock()
		if got >= want {
			return nil
		}
		select {
		case <-changed:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		r.mu.Lock()
		got = r.probes
		r.mu.Unlock()
		if got >= want {
			return nil
		}
	}
	return fmt.Errorf("containerd event subscription in namespace %s did not deliver a probe event within 10s", r.ns)
}

func (r *recorder) add(topic string, payload typeurl.Any, stamped time.Time) {
	now := time.Now()
	e := event{Topic: topic, Received: now, Stamped: stamped}
	if topic == probeTopic {
		r.mu.Lock()
		r.probes++
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
		return
	}
	v, err := typeurl.UnmarshalAny(payload)
	if err != nil {
		return
	}
	switch ev := v.(type) {
	case *apievents.ContainerCreate:
		e.ContainerID = ev.ID
	case *apievents.TaskCreate:
		e.ContainerID = ev.ContainerID
	case *apievents.TaskStart:
		e.ContainerID = ev.ContainerID
	case *apievents.TaskExit:
		if ev.ID != ev.ContainerID {
			return
		}
		e.ContainerID = ev.ContainerID
	case *apievents.SnapshotPrepare:
		// The agent and ctr both name the snapshot after the container.
		e.ContainerID = ev.Key
	default:
		return
	}
	r.mu.Lock()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// waitFor blocks until, for every key in keys, an event with topic received at or after since
// exists whose container id match maps to that key; it returns the first such event per key.
func (r *recorder) waitFor(ctx context.Context, topic string, since time.Time, keys []string, match func(id string) string) (map[string]event, error) {
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	found := map[string]event{}
	seen := 0
	for {
		r.mu.Lock()
		evs, changed := r.events[seen:], r.changed
		seen = len(r.events)
		r.mu.Unlock()
		for _, e := range evs {
			if e.Topic != topic || e.Received.Before(since) {
				continue
			}
			k := match(e.ContainerID)
			if !want[k] {
				continue
			}
			if _, dup := found[k]; !dup {
				found[k] = e
			}
		}
		if len(found) == len(want) {
			return found, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			var missing []string
			for k := range want {
				if _, ok := found[k]; !ok {
					missing = append(missing, k)
				}
			}
			return found, fmt.Errorf("no %s event for %s: %w", topic, strings.Join(missing, ", "), ctx.Err())
		}
	}
}

// between returns the events received in [from, to] whose container id match maps to key.
func (r *recorder) between(from, to time.Time, key string, match func(id string) string) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event
	for _, e := range r.events {
		if e.Received.Before(from) || e.Received.After(to) || match(e.ContainerID) != key {
			continue
		}
		out = append(out, e)
	}
	return out
}

// count returns how many events with topic were received in [from, to] for the containers whose
// id match maps to one of keys.
func (r *recorder) count(topic string, from, to time.Time, keys []string, match func(id string) string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Topic != topic || e.Received.Before(from) || e.Received.After(to) {
			continue
		}
		if k := match(e.ContainerID); k != "" && slices.Contains(keys, k) {
			n++
		}
	}
	return n
}
