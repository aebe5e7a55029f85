package main

import (
	"os"
	goruntime "runtime"
	"strings"

	"github.com/mqlet/mqlet/hw"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// basicNodeStatus is the node status the MQTT uplink publishes until the node-status work (hw/
// readers, kubelet-style setters, pressure conditions) replaces it: identity, addresses, capacity
// and nodeInfo, with Ready true while the agent runs. Everything in it changes rarely, so an idle
// node publishes it once.
func basicNodeStatus(name, containerdVersion string) func() *v1.Node {
	info := v1.NodeSystemInfo{
		KubeletVersion:          "mqlet/" + version,
		ContainerRuntimeVersion: "containerd://" + containerdVersion,
		OperatingSystem:         goruntime.GOOS,
		Architecture:            goruntime.GOARCH,
		KernelVersion:           kernelRelease(),
		BootID:                  readTrimmed("/proc/sys/kernel/random/boot_id"),
		MachineID:               readTrimmed("/etc/machine-id"),
		OSImage:                 osImage(),
	}
	return func() *v1.Node {
		n := &v1.Node{
			TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				"kubernetes.io/hostname": name,
				"kubernetes.io/os":       goruntime.GOOS,
				"kubernetes.io/arch":     goruntime.GOARCH,
			}},
		}
		capacity := v1.ResourceList{
			v1.ResourceCPU:  *resource.NewQuantity(int64(goruntime.NumCPU()), resource.DecimalSI),
			v1.ResourcePods: *resource.NewQuantity(110, resource.DecimalSI),
		}
		if mem, err := hw.MemoryCapacity(); err == nil {
			capacity[v1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
		}
		n.Status.Capacity = capacity
		n.Status.Allocatable = capacity.DeepCopy()
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeHostName, Address: name}}
		if ip := hw.HostIP(); ip != "" {
			n.Status.Addresses = append([]v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}, n.Status.Addresses...)
		}
		n.Status.NodeInfo = info
		n.Status.Conditions = []v1.NodeCondition{{
			Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "MqletReady", Message: "mqlet is running",
		}}
		return n
	}
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// osImage is PRETTY_NAME from os-release, as kubelet reports it.
func osImage() string {
	for _, p := range []string{"/etc/os-release", "/usr/lib/os-release"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				return strings.Trim(v, `"'`)
			}
		}
	}
	return ""
}
