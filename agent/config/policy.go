package config

import (
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/agent/eviction"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ResourcePID is the reservation key for process IDs in systemReserved/agentReserved, as kubelet
// spells it; it is not a resource pods request.
const ResourcePID v1.ResourceName = "pid"

// parsePairs reads "k=v" items (kubelet's map flags) and "signal<value" items (kubelet's
// --eviction-hard form) into a map.
func parsePairs(items []string) (map[string]string, error) {
	out := map[string]string{}
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok {
			k, v, ok = strings.Cut(it, "<")
		}
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want NAME=VALUE (or SIGNAL<VALUE for eviction thresholds)", it)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%q: %s given twice", it, k)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// mapString writes a map the way its flag takes it, sorted, for help texts.
func mapString(m map[string]string, sep string) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+sep+m[k])
	}
	return strings.Join(parts, ",")
}

// Reservations returns systemReserved and agentReserved as resource lists (cpu, memory,
// ephemeral-storage, pid). The settings were validated by Load.
func (c Config) Reservations() (system, agent v1.ResourceList) {
	system, _ = parseReserved(c.SystemReserved)
	agent, _ = parseReserved(c.AgentReserved)
	return system, agent
}

func parseReserved(m map[string]string) (v1.ResourceList, error) {
	out := v1.ResourceList{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		name := v1.ResourceName(k)
		switch name {
		case v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage, ResourcePID:
		default:
			return nil, fmt.Errorf("%s: unknown resource (want cpu, memory, ephemeral-storage or pid)", k)
		}
		q, err := resource.ParseQuantity(m[k])
		if err != nil || q.Sign() < 0 {
			return nil, fmt.Errorf("%s=%q: want a non-negative quantity such as 200m, 150Mi or 1Gi", k, m[k])
		}
		out[name] = q
	}
	return out, nil
}

// Thresholds returns the eviction thresholds (validated by Load).
func (c Config) Thresholds() []eviction.Threshold {
	ts, _ := eviction.ParseThresholds(c.EvictionHard, c.EvictionSoft, c.EvictionSoftGracePeriod, c.EvictionMinimumReclaim)
	return ts
}

// Taints returns nodeTaints as Kubernetes taints (validated by Load).
func (c Config) Taints() []v1.Taint {
	out := make([]v1.Taint, 0, len(c.NodeTaints))
	for _, s := range c.NodeTaints {
		t, _ := parseTaint(s)
		out = append(out, t)
	}
	return out
}

func parseTaint(s string) (v1.Taint, error) {
	kv, effect, ok := strings.Cut(s, ":")
	if !ok {
		return v1.Taint{}, fmt.Errorf("want KEY[=VALUE]:EFFECT")
	}
	key, value, _ := strings.Cut(kv, "=")
	t := v1.Taint{Key: key, Value: value, Effect: v1.TaintEffect(effect)}
	switch t.Effect {
	case v1.TaintEffectNoSchedule, v1.TaintEffectPreferNoSchedule, v1.TaintEffectNoExecute:
	default:
		return t, fmt.Errorf("effect %q must be NoSchedule, PreferNoSchedule or NoExecute", effect)
	}
	if msgs := validation.IsQualifiedName(key); len(msgs) > 0 {
		return t, fmt.Errorf("key %q: %s", key, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsValidLabelValue(value); len(msgs) > 0 {
		return t, fmt.Errorf("value %q: %s", value, strings.Join(msgs, "; "))
	}
	return t, nil
}

// DeviceResource is one resource of host devices: the globs that find its device nodes and how
// many pods may share one node.
type DeviceResource struct {
	Name  v1.ResourceName
	Globs []string
	Share int
}

// DeviceResources returns the devices setting grouped by resource name, in name order (validated
// by Load). Entries naming the same resource add globs; the largest SHARE given wins.
func (c Config) DeviceResources() []DeviceResource {
	byName := map[v1.ResourceName]*DeviceResource{}
	for _, e := range c.Devices {
		name, glob, share, err := parseDevice(e)
		if err != nil {
			continue
		}
		d := byName[name]
		if d == nil {
			d = &DeviceResource{Name: name, Share: share}
			byName[name] = d
		}
		d.Globs = append(d.Globs, glob)
		d.Share = max(d.Share, share)
	}
	out := make([]DeviceResource, 0, len(byName))
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, *byName[n])
	}
	return out
}

func parseDevice(e string) (v1.ResourceName, string, int, error) {
	name, rest, ok := strings.Cut(e, "=")
	if !ok {
		return "", "", 0, fmt.Errorf("want NAME=GLOB[:SHARE], e.g. mqlet.io/serial=/dev/ttyUSB*")
	}
	glob, shareS, hasShare := strings.Cut(rest, ":")
	share := 1
	if hasShare {
		n, err := strconv.Atoi(shareS)
		if err != nil || n < 1 {
			return "", "", 0, fmt.Errorf("share %q must be a whole number of at least 1", shareS)
		}
		share = n
	}
	// An extended resource must be domain-qualified and outside kubernetes.io, as for device plugins.
	dom, _, qualified := strings.Cut(name, "/")
	if msgs := validation.IsQualifiedName(name); len(msgs) > 0 || !qualified {
		return "", "", 0, fmt.Errorf("resource name %q must be a domain-qualified name such as mqlet.io/serial", name)
	}
	if dom == "kubernetes.io" || strings.HasSuffix(dom, ".kubernetes.io") {
		return "", "", 0, fmt.Errorf("resource name %q: the kubernetes.io domain is reserved", name)
	}
	if !filepath.IsAbs(glob) || filepath.Clean(glob) != glob {
		return "", "", 0, fmt.Errorf("device glob %q must be an absolute, clean path such as /dev/ttyUSB*", glob)
	}
	if _, err := filepath.Match(glob, glob); err != nil {
		return "", "", 0, fmt.Errorf("device glob %q: %v", glob, err)
	}
	return v1.ResourceName(name), glob, share, nil
}

// ShutdownSignalNumber is shutdownSignal as a signal; 0 when none is set (validated by Load).
func (c Config) ShutdownSignalNumber() syscall.Signal {
	s, _ := parseSignal(c.ShutdownSignal)
	return s
}

func parseSignal(name string) (syscall.Signal, error) {
	if name == "" {
		return 0, nil
	}
	n := strings.ToUpper(name)
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	s := unix.SignalNum(n)
	if s == 0 {
		return 0, fmt.Errorf("unknown signal (want a name such as SIGPWR or SIGUSR2)")
	}
	switch s {
	case unix.SIGTERM, unix.SIGINT, unix.SIGKILL, unix.SIGSTOP:
		// SIGTERM and SIGINT stop the agent and leave pods running, as with kubelet.
		return 0, fmt.Errorf("%s already means something else (SIGTERM/SIGINT stop the agent, leaving pods running)", n)
	}
	return s, nil
}

// validatePolicy checks the node status, cgroup, eviction, image GC, device, shutdown and metrics
// settings.
func (c Config) validatePolicy(bad func(key, value, reason string, args ...any)) {
	if c.NodeStatusUpdateFrequency.Duration < time.Second {
		bad("nodeStatusUpdateFrequency", c.NodeStatusUpdateFrequency.String(), "must be at least 1s")
	}
	if c.NodeStatusMaxImages < 0 {
		bad("nodeStatusMaxImages", strconv.FormatInt(c.NodeStatusMaxImages, 10), "must not be negative")
	}
	for _, k := range slices.Sorted(maps.Keys(c.NodeLabels)) {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			bad("nodeLabels", k+"="+c.NodeLabels[k], "key: %s", strings.Join(msgs, "; "))
		} else if msgs := validation.IsValidLabelValue(c.NodeLabels[k]); len(msgs) > 0 {
			bad("nodeLabels", k+"="+c.NodeLabels[k], "value: %s", strings.Join(msgs, "; "))
		}
	}
	for _, t := range c.NodeTaints {
		if _, err := parseTaint(t); err != nil {
			bad("nodeTaints", t, "%v", err)
		}
	}
	if c.PodPidsLimit < -1 {
		bad("podPidsLimit", strconv.FormatInt(c.PodPidsLimit, 10), "must be -1 (no limit), 0 (no limit) or a number of processes")
	}
	if c.MaxPods < 1 {
		bad("maxPods", strconv.FormatInt(c.MaxPods, 10), "must be at least 1")
	}
	if !filepath.IsAbs(c.ImageFSDir) {
		bad("imageFSDir", c.ImageFSDir, "must be an absolute path")
	}
	switch c.CgroupDriver {
	case CgroupDriverAuto, CgroupDriverSystemd, CgroupDriverCgroupfs:
	default:
		bad("cgroupDriver", c.CgroupDriver, "must be one of auto, systemd, cgroupfs")
	}
	if !filepath.IsAbs(c.CgroupRoot) || filepath.Clean(c.CgroupRoot) != c.CgroupRoot || c.CgroupRoot == "/" {
		bad("cgroupRoot", c.CgroupRoot, "must be an absolute, clean cgroup path below the root, such as /mqlet")
	}
	if _, err := parseReserved(c.SystemReserved); err != nil {
		bad("systemReserved", mapString(c.SystemReserved, "="), "%v", err)
	}
	if _, err := parseReserved(c.AgentReserved); err != nil {
		bad("agentReserved", mapString(c.AgentReserved, "="), "%v", err)
	}
	if _, err := eviction.ParseThresholds(c.EvictionHard, c.EvictionSoft, c.EvictionSoftGracePeriod, c.EvictionMinimumReclaim); err != nil {
		bad("evictionHard", mapString(c.EvictionHard, "<"), "%v", err)
	}
	if c.EvictionPressureTransitionPeriod.Duration < 0 {
		bad("evictionPressureTransitionPeriod", c.EvictionPressureTransitionPeriod.String(), "must not be negative")
	}
	if c.EvictionMaxPodGracePeriod.Duration < 0 {
		bad("evictionMaxPodGracePeriod", c.EvictionMaxPodGracePeriod.String(), "must not be negative")
	}
	if c.EvictionMonitoringPeriod.Duration < 100*time.Millisecond {
		bad("evictionMonitoringPeriod", c.EvictionMonitoringPeriod.String(), "must be at least 100ms")
	}
	pct := func(key string, v int64) bool {
		if v < 0 || v > 100 {
			bad(key, strconv.FormatInt(v, 10), "must be a percentage from 0 to 100")
			return false
		}
		return true
	}
	if pct("imageGCHighThresholdPercent", c.ImageGCHighThresholdPercent) && pct("imageGCLowThresholdPercent", c.ImageGCLowThresholdPercent) &&
		c.ImageGCLowThresholdPercent > c.ImageGCHighThresholdPercent {
		bad("imageGCLowThresholdPercent", strconv.FormatInt(c.ImageGCLowThresholdPercent, 10),
			"must not exceed imageGCHighThresholdPercent (%d)", c.ImageGCHighThresholdPercent)
	}
	if c.ImageMinimumGCAge.Duration < 0 {
		bad("imageMinimumGCAge", c.ImageMinimumGCAge.String(), "must not be negative")
	}
	for _, d := range c.Devices {
		if _, _, _, err := parseDevice(d); err != nil {
			bad("devices", d, "%v", err)
		}
	}
	if c.ShutdownGracePeriod.Duration < 0 {
		bad("shutdownGracePeriod", c.ShutdownGracePeriod.String(), "must not be negative")
	}
	if c.ShutdownGracePeriodCriticalPods.Duration < 0 || c.ShutdownGracePeriodCriticalPods.Duration > c.ShutdownGracePeriod.Duration {
		bad("shutdownGracePeriodCriticalPods", c.ShutdownGracePeriodCriticalPods.String(),
			"must be from 0 to shutdownGracePeriod (%s)", c.ShutdownGracePeriod.String())
	}
	if _, err := parseSignal(c.ShutdownSignal); err != nil {
		bad("shutdownSignal", c.ShutdownSignal, "%v", err)
	}
	if c.MetricsAddress != "" {
		if _, err := strconv.Atoi(c.MetricsAddress); err == nil {
			bad("metricsAddress", c.MetricsAddress, "a port alone: want HOST:PORT or HOST (port %d), e.g. 127.0.0.1:%d or 127.0.0.1",
				DefaultMetricsPort, DefaultMetricsPort)
		} else if _, port, err := net.SplitHostPort(c.MetricsListenAddress()); err != nil {
			bad("metricsAddress", c.MetricsAddress, "want HOST:PORT or HOST (port %d), e.g. 127.0.0.1:%d: %v", DefaultMetricsPort, DefaultMetricsPort, err)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			bad("metricsAddress", c.MetricsAddress, "port %q must be a number from 0 to 65535", port)
		}
	}
}

// The values of cgroupDriver.
const (
	CgroupDriverAuto     = "auto"
	CgroupDriverSystemd  = "systemd"
	CgroupDriverCgroupfs = "cgroupfs"
)
