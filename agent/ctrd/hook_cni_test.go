package ctrd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// fakeNetwork records what the sandbox asks of the pod network.
type fakeNetwork struct {
	mu        sync.Mutex
	setups    []string // "<uid> <netns> fresh=<bool> hosts=<exists>"
	teardowns []string // "<uid> <netns>"
	attached  map[string]bool
	err       error
	hostsDir  string
}

func (f *fakeNetwork) Setup(_ context.Context, pod *v1.Pod, netns string, fresh bool) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, err := os.Stat(filepath.Join(f.hostsDir, string(pod.UID), "hosts"))
	f.setups = append(f.setups, strings.Join([]string{string(pod.UID), netns, "fresh=" + boolStr(fresh), "hosts=" + boolStr(err == nil)}, " "))
	if f.err != nil {
		return nil, f.err
	}
	f.attached[string(pod.UID)] = true
	return []string{"10.89.0.9"}, nil
}

func (f *fakeNetwork) Teardown(_ context.Context, uid, netns string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.teardowns = append(f.teardowns, uid+" "+netns)
	delete(f.attached, uid)
	return nil
}

func (f *fakeNetwork) Pods() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for uid := range f.attached {
		out = append(out, uid)
	}
	return out, nil
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// The CNI hook attaches the pod's pinned namespace right after it is made (fresh), before the
// hosts file is written, and fills PodIPs; a set-up that finds the namespace intact says so; the
// attachment is a leftover the sweep sees, and removal releases it while the namespace still
// exists. hostNetwork pods are never attached. A failing attachment fails the set-up, naming it.
func TestCNIHookOrderAndLifecycle(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	net := &fakeNetwork{attached: map[string]bool{}, hostsDir: filepath.Join(r.opts.StateDir, "pods")}
	r.opts.Network = net
	ctx := context.Background()
	pod := sandboxPod("uid-net", "net")
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)) })
	if want := "uid-net " + sb.NetNS + " fresh=true hosts=false"; len(net.setups) != 1 || net.setups[0] != want {
		t.Fatalf("Setup calls %q, want [%q] (before the hosts file)", net.setups, want)
	}
	if !slices.Equal(sb.PodIPs, []string{"10.89.0.9"}) {
		t.Errorf("PodIPs = %v", sb.PodIPs)
	}
	if _, err := r.EnsureSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if want := "uid-net " + sb.NetNS + " fresh=false hosts=true"; net.setups[1] != want {
		t.Errorf("second Setup %q, want %q", net.setups[1], want)
	}

	// A pod with only an attachment left (its agent died after ADD) is a leftover.
	net.attached["uid-orphan"] = true
	refs, err := r.ListSandboxes()
	if err != nil || !slices.ContainsFunc(refs, func(p PodRef) bool { return p.UID == "uid-orphan" }) {
		t.Errorf("ListSandboxes = %v, %v; want the attachment-only pod", refs, err)
	}
	if err := r.RemoveSandbox(ctx, PodRef{UID: "uid-orphan"}); err != nil {
		t.Fatal(err)
	}
	if err := r.RemoveSandbox(ctx, RefOf(pod)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(net.teardowns, []string{"uid-orphan ", "uid-net " + sb.NetNS}) {
		t.Errorf("Teardown calls %q; want the orphan without a namespace, the pod with its live one", net.teardowns)
	}

	host := sandboxPod("uid-host", "host")
	host.Spec.HostNetwork = true
	if sb, err := r.EnsureSandbox(ctx, host); err != nil || len(sb.PodIPs) != 0 {
		t.Fatalf("hostNetwork pod: %v, PodIPs %v", err, sb.PodIPs)
	}
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(host)) })
	if len(net.setups) != 2 {
		t.Errorf("a hostNetwork pod was attached: %q", net.setups)
	}

	net.err = errors.New(`CNI plugin "bridge" not found`)
	broken := sandboxPod("uid-broken", "broken")
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(broken)) })
	if _, err := r.EnsureSandbox(ctx, broken); err == nil || !strings.Contains(err.Error(), `pod network (CNI): CNI plugin "bridge" not found`) {
		t.Errorf("EnsureSandbox with a failing network: %v", err)
	}
}
