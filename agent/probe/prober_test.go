package probe

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// hostTarget is a hostNetwork-style target: connections from the test's own namespace to loopback.
func hostTarget() Target {
	return Target{Pod: &v1.Pod{}, Container: &v1.Container{Name: "c", Ports: []v1.ContainerPort{{Name: "web", ContainerPort: 1}}}, PodIP: "127.0.0.1"}
}

func serverPort(t *testing.T, rawURL string) int {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(u.Port())
	return n
}

func TestHTTPGet(t *testing.T) {
	var gotUA, gotHeader, gotHost string
	okHits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			okHits++
			gotUA, gotHeader, gotHost = r.Header.Get("User-Agent"), r.Header.Get("X-Probe"), r.Host
			fmt.Fprint(w, "fine")
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/here":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/away":
			http.Redirect(w, r, "http://elsewhere.invalid/ok", http.StatusFound)
		case "/big":
			w.Header().Set("Location", "http://elsewhere.invalid/")
			w.WriteHeader(http.StatusMovedPermanently)
			w.Write([]byte(strings.Repeat("x", 1<<20)))
		}
	}))
	defer srv.Close()
	port := serverPort(t, srv.URL)
	p := NewProber()
	tg := hostTarget()
	tg.Container.Ports[0].ContainerPort = int32(port)
	run := func(path string, port intstr.IntOrString, headers ...v1.HTTPHeader) (Result, string, error) {
		return p.Run(context.Background(), tg, &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: path, Port: port, HTTPHeaders: headers}}, 2*time.Second)
	}

	res, out, err := run("/ok", intstr.FromString("web"), v1.HTTPHeader{Name: "X-Probe", Value: "yes"}, v1.HTTPHeader{Name: "Host", Value: "app.example"})
	if err != nil || res != Success || okHits != 1 {
		t.Errorf("/ok by port name: %v %q %v, server hit %d times", res, out, err, okHits)
	}
	if !strings.HasPrefix(gotUA, "kube-probe/1.") || gotHeader != "yes" || gotHost != "app.example" {
		t.Errorf("request had User-Agent %q, X-Probe %q, Host %q", gotUA, gotHeader, gotHost)
	}
	if res, out, _ := run("/fail", intstr.FromInt32(int32(port))); res != Failure || !strings.Contains(out, "503") {
		t.Errorf("/fail: %v %q, want failure naming 503", res, out)
	}
	if res, out, _ := run("/here", intstr.FromInt32(int32(port))); res != Success || okHits != 2 {
		t.Errorf("redirect to the same host: %v %q, /ok hit %d times in all, want it followed", res, out, okHits)
	}
	if res, _, _ := run("/away", intstr.FromInt32(int32(port))); res != Warning {
		t.Errorf("redirect to another host: %v, want a warning (success, not followed)", res)
	}
	if res, out, _ := run("/big", intstr.FromInt32(int32(port))); res != Warning || strings.Count(out, "x") != maxBody {
		t.Errorf("big body of a redirect elsewhere: %v, kept %d bytes of it, want %d", res, strings.Count(out, "x"), maxBody)
	}
	if _, _, err := run("/ok", intstr.FromString("nope")); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown port name: %v, want an error naming it", err)
	}
	srv.Close()
	if res, out, _ := run("/ok", intstr.FromInt32(int32(port))); res != Failure || !strings.Contains(out, "refused") {
		t.Errorf("nothing listening: %v %q", res, out)
	}
}

func TestHTTPGetTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	tg := hostTarget()
	res, out, err := NewProber().Run(context.Background(), tg, &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Port: intstr.FromInt32(int32(serverPort(t, srv.URL)))}}, 300*time.Millisecond)
	if err != nil || res != Failure || !strings.Contains(out, "no response within 300ms") {
		t.Errorf("slow server: %v %q %v, want a timeout failure", res, out, err)
	}
}

func TestTCPSocket(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	p := NewProber()
	h := &v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}
	if res, out, err := p.Run(context.Background(), hostTarget(), h, time.Second); res != Success || err != nil {
		t.Errorf("listening: %v %q %v", res, out, err)
	}
	l.Close()
	if res, _, _ := p.Run(context.Background(), hostTarget(), h, time.Second); res != Failure {
		t.Errorf("closed: %v, want failure", res)
	}
}

// grpc against a real health server in the test process, on loopback (hostNetwork-style).
func TestGRPC(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(l)
	defer srv.Stop()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	port := int32(l.Addr().(*net.TCPAddr).Port)
	p := NewProber()
	run := func(port int32, service *string) (Result, string, error) {
		return p.Run(context.Background(), hostTarget(), &v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: port, Service: service}}, 2*time.Second)
	}
	db, unknown := "db", "unknown"
	if res, out, err := run(port, nil); res != Success || err != nil {
		t.Errorf("serving: %v %q %v", res, out, err)
	}
	if res, out, _ := run(port, &db); res != Failure || !strings.Contains(out, "NOT_SERVING") {
		t.Errorf("not serving: %v %q", res, out)
	}
	if res, _, _ := run(port, &unknown); res != Failure {
		t.Errorf("unknown service: %v, want failure", res)
	}
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_SERVING)
	if res, out, _ := run(port, &db); res != Success {
		t.Errorf("db serving again: %v %q", res, out)
	}

	// A gRPC server without the health service.
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bare := grpc.NewServer()
	go bare.Serve(l2)
	defer bare.Stop()
	if res, out, _ := run(int32(l2.Addr().(*net.TCPAddr).Port), nil); res != Failure || !strings.Contains(out, "health protocol") {
		t.Errorf("no health service: %v %q", res, out)
	}
}

// testNetNS makes a network namespace with loopback up, pinned at a file under the test's temp
// dir, and removes it at the end.
func testNetNS(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		if err := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, ""); err != nil {
			errc <- err
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		ifr, _ := unix.NewIfreq("lo")
		unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr)
		ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
		errc <- unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
	}()
	if err := <-errc; err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		t.Fatalf("make network namespace: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH) })
	return path
}

// listenIn opens a TCP listener on loopback inside the network namespace at path.
func listenIn(t testing.TB, path string) net.Listener {
	t.Helper()
	type res struct {
		l   net.Listener
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		f, err := os.Open(path)
		if err != nil {
			c <- res{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			c <- res{nil, err}
			return
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		c <- res{l, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.l.Close() })
	return r.l
}

// A pod with only loopback in its namespace (no pod network yet) is probed from inside it; the
// same port on the host's loopback is not what answers.
func TestProbesDialInsideThePodNetworkNamespace(t *testing.T) {
	ns := testNetNS(t)
	l := listenIn(t, ns)
	hits := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++; fmt.Fprint(w, "from the pod") })}
	go srv.Serve(l)
	defer srv.Close()
	port := l.Addr().(*net.TCPAddr).Port
	p := NewProber()
	pod := Target{Pod: &v1.Pod{}, Container: &v1.Container{Name: "c"}, NetNS: ns}
	http := &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(int32(port))}}
	if res, out, err := p.Run(context.Background(), pod, http, 2*time.Second); res != Success || hits != 1 {
		t.Errorf("httpGet in the pod's namespace: %v %q %v, server hit %d times", res, out, err, hits)
	}
	tcp := &v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}
	if res, out, err := p.Run(context.Background(), pod, tcp, 2*time.Second); res != Success {
		t.Errorf("tcpSocket in the pod's namespace: %v %q %v", res, out, err)
	}
	// From the host's namespace, the pod's loopback port is not there (nothing of ours listens on
	// the host at that port; if something else happens to, the check says nothing).
	if c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Skip("the port is taken on the host too; cannot tell namespaces apart")
	}
	if res, _, _ := p.Run(context.Background(), hostTarget(), tcp, 2*time.Second); res != Failure {
		t.Errorf("the same probe from the host's namespace: %v, want failure", res)
	}
	// The agent's threads are back in the host's namespace: a plain dial sees the host's loopback.
	for i := 0; i < 20; i++ {
		if c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Fatalf("a thread stayed in the pod's namespace (dial %d reached the pod)", i)
		}
	}
}

// gRPC, too, reaches a server that exists only in the pod's namespace.
func TestGRPCInsideThePodNetworkNamespace(t *testing.T) {
	ns := testNetNS(t)
	l := listenIn(t, ns)
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(l)
	defer srv.Stop()
	pod := Target{Pod: &v1.Pod{}, Container: &v1.Container{Name: "c"}, NetNS: ns}
	h := &v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: int32(l.Addr().(*net.TCPAddr).Port)}}
	if res, out, err := NewProber().Run(context.Background(), pod, h, 2*time.Second); res != Success {
		t.Errorf("grpc in the pod's namespace: %v %q %v", res, out, err)
	}
}

// The User-Agent's version follows the k8s.io/api the node is built with.
func TestKubeVersionMatchesGoMod(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	minor := strings.TrimPrefix(kubeVersion, "1.")
	if !strings.Contains(string(b), "\tk8s.io/api v0."+minor+".") {
		t.Errorf("kubeVersion %s does not match k8s.io/api in go.mod", kubeVersion)
	}
}

// Probes tick on multiples of their period, a period apart once aligned and never sooner than
// half a period after the one before.
func TestUntilTick(t *testing.T) {
	base := time.Unix(1000, 0)
	for _, c := range []struct {
		now  time.Duration // after base
		want time.Duration
	}{
		{0, time.Second},
		{5 * time.Millisecond, 995 * time.Millisecond},
		{400 * time.Millisecond, 600 * time.Millisecond},
		{600 * time.Millisecond, 1400 * time.Millisecond},
		{999 * time.Millisecond, 1001 * time.Millisecond},
	} {
		if got := untilTick(base.Add(c.now), time.Second); got != c.want {
			t.Errorf("at +%v: next in %v, want %v", c.now, got, c.want)
		}
	}
	if got := untilTick(time.Unix(1003, 0).Add(2*time.Second), 10*time.Second); got != 5*time.Second {
		t.Errorf("period 10s at 1005: %v, want 5s", got)
	}
}

// An httpGet hook fails only when it gets no response (kubelet ignores the status); sleep waits
// or ends with its context.
func TestHooks(t *testing.T) {
	var ua string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ua = r.Header.Get("User-Agent")
		w.WriteHeader(http.StatusInternalServerError)
	}))
	port := serverPort(t, srv.URL)
	p := NewProber()
	hook := &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Path: "/stop", Port: intstr.FromInt32(int32(port))}}
	if err := p.RunHook(context.Background(), hostTarget(), hook); err != nil {
		t.Errorf("httpGet hook answered 500: %v, want no error", err)
	}
	if !strings.HasPrefix(ua, "kube-lifecycle/") {
		t.Errorf("hook User-Agent %q", ua)
	}
	srv.Close()
	if err := p.RunHook(context.Background(), hostTarget(), hook); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("httpGet hook with nothing listening: %v, want connection refused", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.RunHook(ctx, hostTarget(), &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 30}}); err == nil {
		t.Error("a sleep hook cut short by its deadline reported success")
	}
	if err := p.RunHook(context.Background(), hostTarget(), &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}); err == nil || !strings.Contains(err.Error(), "cannot run commands") {
		t.Errorf("exec hook without an Execer: %v", err)
	}
}
