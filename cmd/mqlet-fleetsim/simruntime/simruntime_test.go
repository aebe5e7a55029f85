package simruntime_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/probe"
	"github.com/mqlet/mqlet/cmd/mqlet-fleetsim/simruntime"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The runtime must be usable wherever the agent takes the real one, exec probes included.
var (
	_ agent.Runtime = (*simruntime.Runtime)(nil)
	_ probe.Execer  = (*simruntime.Runtime)(nil)
)

func pod(uid, name string, ctrs ...v1.Container) *v1.Pod {
	p := &v1.Pod{}
	p.UID, p.Namespace, p.Name = types.UID(uid), "default", name
	if len(ctrs) == 0 {
		ctrs = []v1.Container{{Name: "app", Image: "busybox:1.36"}}
	}
	p.Spec.Containers = ctrs
	return p
}

func start(t *testing.T, r *simruntime.Runtime, p *v1.Pod, restarts int) ctrd.Container {
	t.Helper()
	ctx := context.Background()
	sb, err := r.EnsureSandbox(ctx, p)
	if err != nil {
		t.Fatalf("EnsureSandbox: %v", err)
	}
	c, err := r.StartContainer(ctx, p, sb, &p.Spec.Containers[0], restarts)
	if err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	return c
}

// events collects what Events delivers until the test ends.
func events(t *testing.T, r *simruntime.Runtime) func() []string {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []string
	done := make(chan error, 1)
	subscribed := make(chan struct{})
	go func() {
		close(subscribed)
		done <- r.Events(ctx, func(e ctrd.Event) {
			mu.Lock()
			got = append(got, e.ContainerID)
			mu.Unlock()
		})
	}()
	<-subscribed
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Events returned %v after its context ended, want context.Canceled", err)
		}
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestContainerLifecycle(t *testing.T) {
	var newImages atomic.Int32
	r := simruntime.New(simruntime.Options{OnNewImage: func() { newImages.Add(1) }})
	ctx := context.Background()
	// Events subscribes on its own goroutine; wait until a stop is seen before relying on it.
	got := events(t, r)
	p := pod("uid-1", "web")

	c := start(t, r, p, 0)
	if c.State != ctrd.StateRunning || c.Pid == 0 || c.ID != ctrd.ContainerID("uid-1", "app", 0) {
		t.Fatalf("started container = %+v, want running with a pid and the derived id", c)
	}
	if c.Image != "docker.io/library/busybox:1.36" || !strings.HasPrefix(c.ImageID, "docker.io/library/busybox@sha256:") {
		t.Errorf("image %q id %q, want the normalized reference and repo@digest", c.Image, c.ImageID)
	}
	if c.Hash != ctrspec.SpecHash(p, &p.Spec.Containers[0]) || c.Grace != ctrd.DefaultGrace {
		t.Errorf("hash %q grace %s, want the spec hash and kubelet's default grace", c.Hash, c.Grace)
	}
	// A second pod with the same image is not a new image.
	start(t, r, pod("uid-2", "web2"), 0)
	if n := newImages.Load(); n != 1 {
		t.Errorf("OnNewImage called %d times for one image, want 1", n)
	}
	imgs, _ := r.ListImages(ctx)
	if len(imgs) != 1 || imgs[0].Name != c.Image || imgs[0].Size <= 0 || !strings.HasPrefix(imgs[0].Digest, "sha256:") {
		t.Errorf("ListImages = %+v, want the one image used", imgs)
	}

	list, _ := r.ListContainers(ctx, "uid-1")
	if len(list) != 1 || list[0].ID != c.ID {
		t.Fatalf("ListContainers(uid-1) = %+v, want only its container", list)
	}
	if all, _ := r.ListContainers(ctx, ""); len(all) != 2 {
		t.Fatalf("ListContainers(all) has %d containers, want 2", len(all))
	}
	if _, err := r.Exec(ctx, c.ID, []string{"true"}, time.Second); err != nil {
		t.Errorf("Exec in a running container: %v", err)
	}

	if err := r.StopContainer(ctx, c.ID, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	list, _ = r.ListContainers(ctx, "uid-1")
	if len(list) != 1 || list[0].State != ctrd.StateExited || list[0].ExitCode != simruntime.ExitCodeSIGTERM || list[0].ExitedAt.IsZero() {
		t.Fatalf("after stop: %+v, want exited with %d and an exit time", list, simruntime.ExitCodeSIGTERM)
	}
	eventually(t, "exit event of the stopped container", func() bool { return len(got()) == 1 && got()[0] == c.ID })
	if _, err := r.Exec(ctx, c.ID, []string{"true"}, time.Second); err == nil {
		t.Error("Exec in a stopped container succeeded")
	}
	// Stopping again changes nothing and sends no second event.
	r.StopContainer(ctx, c.ID, 0)
	if err := r.RemoveContainer(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if list, _ = r.ListContainers(ctx, "uid-1"); len(list) != 0 {
		t.Fatalf("after remove: %+v, want none", list)
	}
	// Removing a running container kills it: an event, with SIGKILL's code never visible since it is gone.
	other := ctrd.ContainerID("uid-2", "app", 0)
	if err := r.RemoveContainer(ctx, other); err != nil {
		t.Fatal(err)
	}
	eventually(t, "exit event of the removed running container", func() bool { return len(got()) == 2 && got()[1] == other })
	if err := r.RemoveContainer(ctx, "no-such-id"); err != nil {
		t.Errorf("removing a missing container: %v", err)
	}
	time.Sleep(20 * time.Millisecond)
	if n := len(got()); n != 2 {
		t.Errorf("%d exit events, want 2 (a second stop and a missing container send none)", n)
	}
}

func TestKillKeepsExit(t *testing.T) {
	r := simruntime.New(simruntime.Options{})
	c := start(t, r, pod("uid-1", "web"), 3)
	if c.RestartCount != 3 || c.ID != ctrd.ContainerID("uid-1", "app", 3) {
		t.Fatalf("attempt 3 = %+v", c)
	}
	r.KillContainer(context.Background(), c.ID, time.Second)
	list, _ := r.ListContainers(context.Background(), "uid-1")
	if len(list) != 1 || list[0].State != ctrd.StateExited || list[0].ExitCode != simruntime.ExitCodeSIGTERM {
		t.Fatalf("after kill: %+v, want the exit kept", list)
	}
}

func TestSandboxAddresses(t *testing.T) {
	// A /29 holds 8 addresses: the network, the gateway (.1) and the broadcast are never handed out.
	r := simruntime.New(simruntime.Options{PodCIDR: netip.MustParsePrefix("10.1.2.0/29")})
	ctx := context.Background()
	seen := map[string]bool{}
	for i := range 5 {
		p := pod("uid-"+string(rune('a'+i)), "p")
		sb, err := r.EnsureSandbox(ctx, p)
		if err != nil {
			t.Fatalf("sandbox %d: %v", i, err)
		}
		if !sb.Created || len(sb.PodIPs) != 1 || sb.Hostname != "p" {
			t.Fatalf("sandbox %d = %+v, want a new one with one address", i, sb)
		}
		ip := sb.PodIPs[0]
		if seen[ip] || ip == "10.1.2.0" || ip == "10.1.2.1" || ip == "10.1.2.7" {
			t.Fatalf("address %s handed out twice or reserved (seen %v)", ip, seen)
		}
		seen[ip] = true
	}
	if _, err := r.EnsureSandbox(ctx, pod("uid-full", "p")); err == nil || !strings.Contains(err.Error(), "no free address") {
		t.Fatalf("sixth sandbox in a /29: err %v, want no free address", err)
	}
	again, err := r.EnsureSandbox(ctx, pod("uid-a", "p"))
	if err != nil || again.Created {
		t.Fatalf("existing sandbox: %+v %v, want it found, not created", again, err)
	}
	if err := r.RemoveSandbox(ctx, ctrd.PodRef{UID: "uid-a"}); err != nil {
		t.Fatal(err)
	}
	sb, err := r.EnsureSandbox(ctx, pod("uid-full", "p"))
	if err != nil || sb.PodIPs[0] != again.PodIPs[0] {
		t.Fatalf("after a removal: %+v %v, want the freed address %s", sb, err, again.PodIPs[0])
	}
	refs, _ := r.ListSandboxes()
	if len(refs) != 5 {
		t.Errorf("ListSandboxes has %d, want 5", len(refs))
	}
	host := pod("uid-host", "h")
	host.Spec.HostNetwork = true
	if sb, _ := r.EnsureSandbox(ctx, host); len(sb.PodIPs) != 0 {
		t.Errorf("hostNetwork pod got addresses %v", sb.PodIPs)
	}
	if err := r.RemoveSandbox(ctx, ctrd.PodRef{UID: "missing"}); err != nil {
		t.Errorf("removing a missing sandbox: %v", err)
	}
	// A container whose sandbox is gone (or was never made for this pod) does not start.
	p := pod("uid-b", "p")
	sb, _ = r.EnsureSandbox(ctx, p)
	r.RemoveSandbox(ctx, ctrd.RefOf(p))
	if _, err := r.StartContainer(ctx, p, sb, &p.Spec.Containers[0], 0); !startReason(err, "CreateContainerError") {
		t.Errorf("start without a sandbox: %v, want CreateContainerError", err)
	}
}

// objects is a ctrspec.Objects over maps.
type objects struct {
	cms     map[string]*v1.ConfigMap
	secrets map[string]*v1.Secret
}

func (o objects) ConfigMap(ns, name string) (*v1.ConfigMap, error) {
	if cm, ok := o.cms[ns+"/"+name]; ok {
		return cm, nil
	}
	return nil, &ctrspec.NotFoundError{Kind: "ConfigMap", Namespace: ns, Name: name}
}

func (o objects) Secret(ns, name string) (*v1.Secret, error) {
	if s, ok := o.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, &ctrspec.NotFoundError{Kind: "Secret", Namespace: ns, Name: name}
}

func startReason(err error, reason string) bool {
	var se *ctrd.StartError
	return errors.As(err, &se) && se.Reason == reason
}

func TestObjectsChecked(t *testing.T) {
	objs := objects{
		cms:     map[string]*v1.ConfigMap{"default/cfg": {Data: map[string]string{"a": "1"}}},
		secrets: map[string]*v1.Secret{"default/tok": {Data: map[string][]byte{"t": []byte("x")}}},
	}
	yes := true
	ctr := v1.Container{Name: "app", Image: "busybox", VolumeMounts: []v1.VolumeMount{{Name: "v", MountPath: "/v"}}}
	cases := []struct {
		name   string
		vol    v1.VolumeSource
		env    []v1.EnvVar
		want   string // "" starts; else the problem's text
		volErr bool
	}{
		{name: "configMap present", vol: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
		{name: "configMap missing", vol: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}}},
			want: "ConfigMap default/nope not found", volErr: true},
		{name: "configMap missing but optional", vol: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}, Optional: &yes}}},
		{name: "configMap key missing", vol: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}, Items: []v1.KeyToPath{{Key: "b", Path: "b"}}}},
			want: "couldn't find key b in ConfigMap default/cfg", volErr: true},
		{name: "secret present", vol: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "tok"}}},
		{name: "secret missing", vol: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "nope"}}, want: "Secret default/nope not found", volErr: true},
		{name: "projected secret missing", vol: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}},
			{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}}}}}},
			want: "Secret default/nope not found", volErr: true},
		{name: "env key of a missing secret", vol: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}},
			env:  []v1.EnvVar{{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "gone"}, Key: "t"}}}},
			want: "env TOKEN: Secret default/gone not found"},
		{name: "env key present", vol: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}},
			env: []v1.EnvVar{{Name: "A", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}, Key: "a"}}}}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := simruntime.New(simruntime.Options{Objects: objs})
			c := ctr
			c.Env = tc.env
			p := pod("uid-"+string(rune('a'+i)), "p", c)
			p.Spec.Volumes = []v1.Volume{{Name: "v", VolumeSource: tc.vol}}
			sb, _ := r.EnsureSandbox(context.Background(), p)
			_, err := r.StartContainer(context.Background(), p, sb, &p.Spec.Containers[0], 0)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("start: %v, want it running", err)
				}
				return
			}
			if !startReason(err, "CreateContainerConfigError") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start: %v, want CreateContainerConfigError saying %q", err, tc.want)
			}
			var me *ctrd.MountError
			if errors.As(err, &me) != tc.volErr {
				t.Errorf("MountError in %v: %v, want %v (the worker emits FailedMount for those)", err, !tc.volErr, tc.volErr)
			}
			if list, _ := r.ListContainers(context.Background(), ""); len(list) != 0 {
				t.Errorf("a refused container was recorded: %+v", list)
			}
		})
	}
	// A container that does not mount the volume does not need its ConfigMap.
	r := simruntime.New(simruntime.Options{})
	p := pod("uid-z", "p")
	p.Spec.Volumes = []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}}}}}
	start(t, r, p, 0)
}

func TestInvalidImage(t *testing.T) {
	r := simruntime.New(simruntime.Options{})
	p := pod("uid-1", "p", v1.Container{Name: "app", Image: "Not A Valid/Image"})
	sb, _ := r.EnsureSandbox(context.Background(), p)
	_, err := r.StartContainer(context.Background(), p, sb, &p.Spec.Containers[0], 0)
	if !startReason(err, "InvalidImageName") || !errors.Is(err, ctrd.ErrInvalidImage) {
		t.Fatalf("start with a malformed image: %v, want InvalidImageName", err)
	}
}

// reporter records what the agent reports.
type reporter struct {
	mu     sync.Mutex
	status map[string]v1.PodStatus
	gone   map[string]bool
}

func (r *reporter) PodStatus(d store.DesiredPod, st v1.PodStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status[d.Pod.Name] = st
}

func (r *reporter) PodGone(d store.DesiredPod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone[d.Pod.Name] = true
}

func (r *reporter) Emit(event.Event) {}

func (r *reporter) phase(name string) (v1.PodPhase, v1.PodStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status[name].Phase, r.status[name]
}

type chanSource chan source.Change

func (chanSource) Kind() source.Kind { return source.MQTT }

func (s chanSource) Run(ctx context.Context, deliver func(source.Change) source.Result) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-s:
			deliver(c)
		}
	}
}

// TestAgentRunsPods runs the real agent on the runtime: a pod becomes Running with its address and
// container status, and a deletion stops it and reports it gone.
func TestAgentRunsPods(t *testing.T) {
	rt := simruntime.New(simruntime.Options{})
	rep := &reporter{status: map[string]v1.PodStatus{}, gone: map[string]bool{}}
	src := make(chanSource, 4)
	a := agent.New(agent.Options{NodeName: "sim-0000", RelistPeriod: time.Hour, SweepPeriod: time.Hour,
		HostIP: func() string { return "10.128.0.1" }, Log: slog.New(slog.DiscardHandler), Report: rep},
		rt, store.NewMemory(), src)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	p := &v1.Pod{}
	p.Namespace, p.Name = "default", "web"
	p.Spec.Containers = []v1.Container{{Name: "app", Image: "nginx:1.27"}, {Name: "side", Image: "busybox"}}
	src <- source.Change{Op: source.Resync, Items: []source.Item{{Pod: p, Ref: source.Ref{Kind: source.MQTT, Origin: "t"}, Generation: 1}}}
	eventually(t, "pod Running", func() bool { ph, _ := rep.phase("web"); return ph == v1.PodRunning })
	_, st := rep.phase("web")
	if len(st.ContainerStatuses) != 2 || st.PodIP == "" || st.HostIP != "10.128.0.1" {
		t.Fatalf("status = %+v, want two container statuses, a pod IP and the host IP", st)
	}
	for _, cs := range st.ContainerStatuses {
		if cs.State.Running == nil || !cs.Ready || cs.ImageID == "" {
			t.Errorf("container %s: %+v, want running, ready, with an image id", cs.Name, cs)
		}
	}
	eventually(t, "agent ready", func() bool { return a.Ready() == nil })

	src <- source.Change{Op: source.Delete, Keys: []string{"default/web"}}
	eventually(t, "pod reported gone", func() bool { rep.mu.Lock(); defer rep.mu.Unlock(); return rep.gone["web"] })
	if list, _ := rt.ListContainers(context.Background(), ""); len(list) != 0 {
		t.Errorf("containers left after the deletion: %+v", list)
	}
	if refs, _ := rt.ListSandboxes(); len(refs) != 0 {
		t.Errorf("sandboxes left after the deletion: %+v", refs)
	}
}
