package devices

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Devices are allocated per container: the container whose limits name a resource gets that many
// distinct devices of it, and only its own. A pod is allocated as a whole (every container or none),
// so a pod never sits on half of what it needs.
//
// Within a pod, kubelet's device manager rule applies: a regular init container has finished before
// the next container starts, so later containers take its devices before any other. This matches
// how admission counts a pod (the largest init container, or the sum of the app containers): a pod
// whose init container and app container each want the node's only serial port fits, and both get
// it. Sidecars (init containers with restartPolicy Always) keep theirs.
//
// A device with SHARE n may be held by n containers at once, of one pod or several. Each container
// that holds it takes one of the n slots; a container handed an init container's device takes no
// new slot.

// Request is what one container of a pod asks for, in the order the containers start.
type Request struct {
	Container string
	Init      bool                      // a regular (not restartable) init container
	Counts    map[v1.ResourceName]int64 // device resources only, each at least 1
}

// Assignment is the devices one container got.
type Assignment struct {
	Container string   `json:"container"`
	Init      bool     `json:"init,omitempty"`
	Devices   []Device `json:"devices"`
}

// Device is one device held by a container: Path is as the config's glob names it (/dev/ttyUSB0),
// which is also where the container finds it.
type Device struct {
	Resource v1.ResourceName `json:"resource"`
	Path     string          `json:"path"`
}

// Allocation is a pod's devices, container by container in start order.
type Allocation []Assignment

// For returns the devices of container name, and whether the allocation names it.
func (a Allocation) For(name string) ([]Device, bool) {
	for _, as := range a {
		if as.Container == name {
			return as.Devices, true
		}
	}
	return nil, false
}

// Paths lists the device paths of container name.
func (a Allocation) Paths(name string) []string {
	ds, _ := a.For(name)
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Path
	}
	return out
}

func (a Allocation) clone() Allocation {
	out := make(Allocation, len(a))
	for i, as := range a {
		out[i] = as
		out[i].Devices = slices.Clone(as.Devices)
	}
	return out
}

// slots counts the slots the pod holds of each device, replaying the reuse rule: a device a
// container takes from an earlier init container costs nothing more.
func (a Allocation) slots() map[Device]int {
	used := map[Device]int{}
	reuse := map[Device]int{} // slots held by finished init containers, free for the next container
	for _, as := range a {
		for _, d := range as.Devices {
			k := Device{Resource: d.Resource, Path: d.Path}
			if reuse[k] > 0 {
				if !as.Init {
					reuse[k]--
				}
				continue
			}
			used[k]++
			if as.Init {
				reuse[k]++
			}
		}
	}
	return used
}

// matches reports whether a was allocated for exactly reqs.
func (a Allocation) matches(reqs []Request) bool {
	if len(a) != len(reqs) {
		return false
	}
	for i, r := range reqs {
		as := a[i]
		if as.Container != r.Container || as.Init != r.Init {
			return false
		}
		got := map[v1.ResourceName]int64{}
		for _, d := range as.Devices {
			got[d.Resource]++
		}
		if !maps.Equal(got, r.Counts) {
			return false
		}
	}
	return true
}

// ShortageError is a container that cannot get as many devices of a resource as it asks for.
type ShortageError struct {
	Resource  v1.ResourceName
	Container string
	Requested int64
	Available int64 // devices this container could have had
	Present   int   // devices of the resource on the node
	Share     int
}

func (e *ShortageError) Error() string {
	return fmt.Sprintf("%s: container %q requests %d device(s), %d available (%d present on the node, each held by at most %d container(s) at a time; the rest are allocated to other pods)",
		e.Resource, e.Container, e.Requested, e.Available, e.Present, e.Share)
}

// UnknownResourceError is a request for a device resource the node does not offer.
type UnknownResourceError struct {
	Resource  v1.ResourceName
	Container string
	Offered   []v1.ResourceName
}

func (e *UnknownResourceError) Error() string {
	offered := "none (no devices in the agent config)"
	if len(e.Offered) > 0 {
		names := make([]string, len(e.Offered))
		for i, n := range e.Offered {
			names[i] = string(n)
		}
		offered = strings.Join(names, ", ")
	}
	return fmt.Sprintf("container %q requests %s, which this node does not offer (device resources offered: %s)", e.Container, e.Resource, offered)
}

// Allocate gives the pod's containers their devices, all or none. A pod that already holds an
// allocation for the same requests gets it back unchanged (after a restart, from Restore); for
// changed requests it is allocated anew, keeping the devices it held where it can. Only devices
// present now are handed out; a device the pod already holds stays its own even while unplugged.
func (m *Manager) Allocate(pod types.UID, reqs []Request) (Allocation, error) {
	var want []Request
	for _, r := range reqs {
		counts := map[v1.ResourceName]int64{}
		for n, c := range r.Counts {
			if c < 0 {
				return nil, fmt.Errorf("container %q: %s count %d is negative", r.Container, n, c)
			}
			if c == 0 {
				continue
			}
			if !m.Offers(n) {
				return nil, &UnknownResourceError{Resource: n, Container: r.Container, Offered: m.Resources()}
			}
			counts[n] = c
		}
		if len(counts) > 0 {
			want = append(want, Request{Container: r.Container, Init: r.Init, Counts: counts})
		}
	}
	m.mu.Lock()
	prev, had := m.pods[pod]
	m.mu.Unlock()
	if had && prev.matches(want) {
		return prev.clone(), nil
	}
	if len(want) == 0 {
		m.Release(pod)
		return nil, nil
	}
	m.Rescan() // hand out only what is plugged in now

	m.mu.Lock()
	defer m.mu.Unlock()
	prev = m.pods[pod]
	used := map[Device]int{}
	for uid, a := range m.pods {
		if uid == pod {
			continue
		}
		for d, n := range a.slots() {
			used[d] += n
		}
	}
	held := map[Device]bool{}
	for _, as := range prev {
		for _, d := range as.Devices {
			held[d] = true
		}
	}
	var out Allocation
	reuse := map[Device]int{}
	for _, r := range want {
		as := Assignment{Container: r.Container, Init: r.Init}
		for _, res := range slices.Sorted(maps.Keys(r.Counts)) {
			got, err := m.pick(r, res, used, reuse, held)
			if err != nil {
				return nil, err
			}
			as.Devices = append(as.Devices, got...)
		}
		out = append(out, as)
	}
	m.pods[pod] = out
	return out.clone(), nil
}

// pick chooses r's devices of res: first those finished init containers of the pod leave, then
// free slots, preferring devices the pod held before, then the least shared, then by path. It
// updates used and reuse with what it takes.
func (m *Manager) pick(r Request, res v1.ResourceName, used, reuse map[Device]int, held map[Device]bool) ([]Device, error) {
	need := r.Counts[res]
	share := m.res[res].Share
	var got []Device
	taken := map[Device]bool{}
	var reusable []Device
	for d, n := range reuse {
		if d.Resource == res && n > 0 {
			reusable = append(reusable, d)
		}
	}
	slices.SortFunc(reusable, func(a, b Device) int { return strings.Compare(a.Path, b.Path) })
	for _, d := range reusable {
		if int64(len(got)) == need {
			break
		}
		got, taken[d] = append(got, d), true
		if !r.Init {
			reuse[d]--
		}
	}
	var free []Device
	for _, p := range m.present[res] {
		d := Device{Resource: res, Path: p}
		if !taken[d] && used[d] < share {
			free = append(free, d)
		}
	}
	slices.SortStableFunc(free, func(a, b Device) int {
		if held[a] != held[b] {
			if held[a] {
				return -1
			}
			return 1
		}
		if used[a] != used[b] {
			return used[a] - used[b]
		}
		return strings.Compare(a.Path, b.Path)
	})
	if avail := int64(len(got) + len(free)); avail < need {
		return nil, &ShortageError{Resource: res, Container: r.Container, Requested: need, Available: avail,
			Present: len(m.present[res]), Share: share}
	}
	for _, d := range free[:need-int64(len(got))] {
		got = append(got, d)
		used[d]++
		if r.Init {
			reuse[d]++
		}
	}
	slices.SortFunc(got, func(a, b Device) int { return strings.Compare(a.Path, b.Path) })
	return got, nil
}

// Restore gives the Manager back a pod's allocation as the runtime recorded it, when the agent
// starts and before any Allocate. It is taken as it is, even over a device's share or for a
// resource no longer configured: the pod's containers hold those devices already.
func (m *Manager) Restore(pod types.UID, a Allocation) error {
	names := map[string]bool{}
	for _, as := range a {
		if as.Container == "" || names[as.Container] {
			return fmt.Errorf("pod %s: device allocation names container %q twice or not at all", pod, as.Container)
		}
		names[as.Container] = true
		for _, d := range as.Devices {
			if _, err := m.hostPath(d.Path); err != nil || d.Resource == "" {
				return errors.Join(fmt.Errorf("pod %s container %q: bad device %q of resource %q", pod, as.Container, d.Path, d.Resource), err)
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(a) == 0 {
		delete(m.pods, pod)
		return nil
	}
	m.pods[pod] = a.clone()
	return nil
}

// Release frees every device of the pod. Releasing a pod that holds none is fine.
func (m *Manager) Release(pod types.UID) {
	m.mu.Lock()
	delete(m.pods, pod)
	m.mu.Unlock()
}

// Lookup returns the pod's allocation, if it has one.
func (m *Manager) Lookup(pod types.UID) (Allocation, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.pods[pod]
	return a.clone(), ok
}

// Pods lists the pods that hold devices, sorted.
func (m *Manager) Pods() []types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.pods))
}
