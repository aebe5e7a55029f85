// Package eviction is the node's eviction manager: it watches the signals kubelet watches
// (memory.available, nodefs/imagefs space and inodes, pid.available), compares them with hard and
// soft thresholds, reclaims node-level resources first and then evicts pods ranked as kubelet ranks
// them. It works with no control plane at all.
package eviction

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Signal names one thing the eviction manager measures, spelled as in kubelet's configuration.
type Signal string

const (
	SignalMemoryAvailable   Signal = "memory.available"
	SignalNodeFsAvailable   Signal = "nodefs.available"
	SignalNodeFsInodesFree  Signal = "nodefs.inodesFree"
	SignalImageFsAvailable  Signal = "imagefs.available"
	SignalImageFsInodesFree Signal = "imagefs.inodesFree"
	SignalPIDAvailable      Signal = "pid.available"
)

// SignalAllocatableMemoryAvailable is kubelet's allocatableMemory.available: the pods' top cgroup's
// memory limit (node allocatable, enforced) minus its working set. It is not configured on its
// own: AllocatableThresholds derives its thresholds from the hard memory.available ones, as
// kubelet does when it enforces node allocatable. Without it, pods with systemReserved set reach
// their top cgroup's limit while the node's memory.available still looks healthy, and the kernel
// kills by oom_score instead of the ranking, with no Evicted status.
const SignalAllocatableMemoryAvailable Signal = "allocatableMemory.available"

// Signals lists every signal mqlet measures that can be configured.
var Signals = []Signal{SignalMemoryAvailable, SignalNodeFsAvailable, SignalNodeFsInodesFree,
	SignalImageFsAvailable, SignalImageFsInodesFree, SignalPIDAvailable}

// order is the order in which met thresholds are acted on: memory first (kubelet's order).
var order = append([]Signal{SignalMemoryAvailable, SignalAllocatableMemoryAvailable}, Signals[1:]...)

// AllocatableThresholds are the allocatableMemory.available thresholds that go with ts when node
// allocatable is enforced on the pods' cgroup: one per hard memory.available threshold, with its
// value and minimum reclaim (kubelet's addAllocatableThresholds).
func AllocatableThresholds(ts []Threshold) []Threshold {
	var out []Threshold
	for _, t := range ts {
		if t.Signal == SignalMemoryAvailable && t.Hard() {
			out = append(out, Threshold{Signal: SignalAllocatableMemoryAvailable, Value: t.Value, MinReclaim: t.MinReclaim})
		}
	}
	return out
}

func knownSignal(s Signal) bool { return slices.Contains(Signals, s) }

// Condition is the node condition a signal's threshold drives.
func (s Signal) Condition() v1.NodeConditionType {
	switch s {
	case SignalMemoryAvailable, SignalAllocatableMemoryAvailable:
		return v1.NodeMemoryPressure
	case SignalPIDAvailable:
		return v1.NodePIDPressure
	}
	return v1.NodeDiskPressure
}

// Resources a signal's pressure is about that are not pod resources: kubelet names them so in its
// messages ("The node was low on resource: inodes.").
const (
	resourceInodes v1.ResourceName = "inodes"
	resourcePIDs   v1.ResourceName = "pids"
)

// Resource is what the node runs low on when the signal is under pressure.
func (s Signal) Resource() v1.ResourceName {
	switch s {
	case SignalMemoryAvailable, SignalAllocatableMemoryAvailable:
		return v1.ResourceMemory
	case SignalNodeFsAvailable, SignalImageFsAvailable:
		return v1.ResourceEphemeralStorage
	case SignalNodeFsInodesFree, SignalImageFsInodesFree:
		return resourceInodes
	}
	return resourcePIDs
}

// disk reports whether the signal is about a file system (node-level reclaim applies).
func (s Signal) disk() bool { return s.Condition() == v1.NodeDiskPressure }

// Value is a threshold or minimum-reclaim amount: an absolute quantity, or a percentage of the
// signal's capacity.
type Value struct {
	Quantity   *resource.Quantity
	Percentage float64 // 0..1, used when Quantity is nil
}

// Of is the value as an amount of capacity.
func (v Value) Of(capacity int64) int64 {
	if v.Quantity != nil {
		return v.Quantity.Value()
	}
	return int64(v.Percentage * float64(capacity))
}

func (v Value) String() string {
	if v.Quantity != nil {
		return v.Quantity.String()
	}
	return strconv.FormatFloat(v.Percentage*100, 'f', -1, 64) + "%"
}

// Threshold is one configured threshold: the signal is under pressure while it is below Value.
// A soft threshold (GracePeriod > 0) must hold that long before it evicts; a hard one evicts at once.
type Threshold struct {
	Signal      Signal
	Value       Value
	GracePeriod time.Duration // 0 for a hard threshold
	MinReclaim  Value         // reclaim this much beyond the threshold once it is crossed
}

// Hard reports whether the threshold evicts without a grace period.
func (t Threshold) Hard() bool { return t.GracePeriod == 0 }

// DefaultHard is kubelet's default evictionHard on Linux.
func DefaultHard() map[string]string {
	return map[string]string{
		string(SignalMemoryAvailable):   "100Mi",
		string(SignalNodeFsAvailable):   "10%",
		string(SignalNodeFsInodesFree):  "5%",
		string(SignalImageFsAvailable):  "15%",
		string(SignalImageFsInodesFree): "5%",
	}
}

// ParseThresholds reads the evictionHard, evictionSoft, evictionSoftGracePeriod and
// evictionMinimumReclaim settings (signal -> value, as in kubelet's config file) with kubelet's
// rules: values are quantities or percentages, a soft threshold needs a grace period and a grace
// period needs a soft threshold, a minimum reclaim applies to the signal's hard and soft thresholds.
// A value of "0", "0%" or "" for a hard signal turns that default off. Errors name the key and value.
func ParseThresholds(hard, soft, softGrace, minReclaim map[string]string) ([]Threshold, error) {
	var out []Threshold
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	reclaim := map[Signal]Value{}
	for _, k := range slices.Sorted(maps.Keys(minReclaim)) {
		s := Signal(k)
		if !knownSignal(s) {
			bad("evictionMinimumReclaim: unknown signal %q (want one of %s)", k, signalList())
			continue
		}
		v, err := parseValue(minReclaim[k])
		if err != nil {
			bad("evictionMinimumReclaim %s=%q: %v", k, minReclaim[k], err)
			continue
		}
		reclaim[s] = v
	}
	for _, k := range slices.Sorted(maps.Keys(hard)) {
		s := Signal(k)
		if !knownSignal(s) {
			bad("evictionHard: unknown signal %q (want one of %s)", k, signalList())
			continue
		}
		if off(hard[k]) {
			continue
		}
		v, err := parseValue(hard[k])
		if err != nil {
			bad("evictionHard %s=%q: %v", k, hard[k], err)
			continue
		}
		out = append(out, Threshold{Signal: s, Value: v, MinReclaim: reclaim[s]})
	}
	for _, k := range slices.Sorted(maps.Keys(soft)) {
		s := Signal(k)
		if !knownSignal(s) {
			bad("evictionSoft: unknown signal %q (want one of %s)", k, signalList())
			continue
		}
		v, err := parseValue(soft[k])
		if err != nil {
			bad("evictionSoft %s=%q: %v", k, soft[k], err)
			continue
		}
		g, ok := softGrace[k]
		if !ok {
			bad("evictionSoft %s=%q: needs a grace period in evictionSoftGracePeriod", k, soft[k])
			continue
		}
		d, err := time.ParseDuration(strings.TrimSpace(g))
		if err != nil || d <= 0 {
			bad("evictionSoftGracePeriod %s=%q: want a positive duration such as 1m30s", k, g)
			continue
		}
		out = append(out, Threshold{Signal: s, Value: v, GracePeriod: d, MinReclaim: reclaim[s]})
	}
	for _, k := range slices.Sorted(maps.Keys(softGrace)) {
		if _, ok := soft[k]; !ok {
			bad("evictionSoftGracePeriod %s: no evictionSoft threshold for this signal", k)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return out, nil
}

func off(s string) bool {
	s = strings.TrimSpace(s)
	return s == "" || s == "0" || s == "0%"
}

func signalList() string {
	names := make([]string, len(Signals))
	for i, s := range Signals {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// parseValue reads "100Mi", "1G", "10%" or "7.5%".
func parseValue(s string) (Value, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 100 {
			return Value{}, fmt.Errorf("percentage must be a number from 0 to 100")
		}
		return Value{Percentage: f / 100}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return Value{}, fmt.Errorf("want a quantity such as 100Mi or a percentage such as 10%%")
	}
	if q.Sign() < 0 {
		return Value{}, fmt.Errorf("must not be negative")
	}
	return Value{Quantity: &q}, nil
}

// HardReserve turns the hard memory and nodefs thresholds into the amounts node allocatable keeps
// back (kubelet subtracts hard eviction thresholds from allocatable), given the node's memory and
// ephemeral-storage capacity.
func HardReserve(ts []Threshold, capacity v1.ResourceList) v1.ResourceList {
	out := v1.ResourceList{}
	for _, t := range ts {
		if !t.Hard() {
			continue
		}
		var name v1.ResourceName
		switch t.Signal {
		case SignalMemoryAvailable:
			name = v1.ResourceMemory
		case SignalNodeFsAvailable:
			name = v1.ResourceEphemeralStorage
		default:
			continue
		}
		c, ok := capacity[name]
		if !ok {
			continue
		}
		out[name] = *resource.NewQuantity(t.Value.Of(c.Value()), resource.BinarySI)
	}
	return out
}
