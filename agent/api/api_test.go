package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakeProvider stands in for the agent: the API only reads two methods.
type fakeProvider struct {
	mu    sync.Mutex
	pods  []v1.Pod
	ready error
}

func (f *fakeProvider) Pods() []v1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]v1.Pod, len(f.pods))
	for i := range f.pods {
		out[i] = *f.pods[i].DeepCopy()
	}
	return out
}

func (f *fakeProvider) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready
}

func (f *fakeProvider) setReady(err error) {
	f.mu.Lock()
	f.ready = err
	f.mu.Unlock()
}

func pod(ns, name string) v1.Pod {
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}},
		Status:     v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.1"},
	}
}

// shortDir returns a temp dir with a short path: unix socket paths must fit
// in 108 bytes, which t.TempDir() under a long test name can exceed.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startServer serves p on a fresh socket and returns its path; the server is
// stopped, and Serve's result checked, when the test ends.
func startServer(t *testing.T, p Provider) string {
	t.Helper()
	sock := filepath.Join(shortDir(t), "run", "mqlet.sock") // "run" does not exist yet
	stop := serveAt(t, p, sock)
	t.Cleanup(stop)
	return sock
}

// serveAt starts Serve on sock, waits until it answers, and returns a func
// that stops it and fails the test if Serve returned an error.
func serveAt(t *testing.T, p Provider, sock string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewServer(p, nil).Serve(ctx, sock) }()
	c := NewClient(sock)
	for {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("Serve(%s) returned early: %v", sock, err)
		default:
		}
		// Ready is fine as a liveness probe here: any HTTP answer, 200 or
		// 503, means the server is up.
		err := c.Ready(context.Background())
		var ue *unreachableError
		if !errors.As(err, &ue) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve(%s): %v", sock, err)
		}
	}
}

func TestListPods(t *testing.T) {
	p := &fakeProvider{pods: []v1.Pod{pod("kube-system", "b"), pod("default", "z"), pod("default", "a")}}
	c := NewClient(startServer(t, p))

	list, err := c.ListPods(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if list.Kind != "PodList" || list.APIVersion != "v1" {
		t.Errorf("TypeMeta = %+v, want v1 PodList", list.TypeMeta)
	}
	var got []string
	for _, it := range list.Items {
		got = append(got, it.Namespace+"/"+it.Name)
	}
	want := "default/a default/z kube-system/b"
	if strings.Join(got, " ") != want {
		t.Errorf("items = %v, want %s", got, want)
	}
	if list.Items[0].Status.PodIP != "10.0.0.1" || list.Items[0].Spec.Containers[0].Image != "busybox" {
		t.Errorf("item lost spec/status: %+v", list.Items[0])
	}

	list, err = c.ListPods(context.Background(), "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "b" {
		t.Errorf("namespace filter: got %+v, want only kube-system/b", list.Items)
	}

	list, err = c.ListPods(context.Background(), "nope")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("unknown namespace: got %d items, want 0", len(list.Items))
	}
}

func TestEmptyListIsAnEmptyArray(t *testing.T) {
	sock := startServer(t, &fakeProvider{})
	body := rawGet(t, sock, "/api/v1/pods", http.StatusOK)
	// kubectl-style consumers index .items; null would break them.
	if !strings.Contains(body, `"items":[]`) {
		t.Errorf("empty list body = %s, want \"items\":[]", body)
	}
}

func TestGetPod(t *testing.T) {
	p := &fakeProvider{pods: []v1.Pod{pod("default", "web"), pod("other", "web")}}
	c := NewClient(startServer(t, p))

	got, err := c.GetPod(context.Background(), "other", "web")
	if err != nil {
		t.Fatal(err)
	}
	if got.Namespace != "other" || got.Name != "web" || got.Kind != "Pod" || got.APIVersion != "v1" {
		t.Errorf("GetPod(other/web) = %s/%s %+v", got.Namespace, got.Name, got.TypeMeta)
	}

	_, err = c.GetPod(context.Background(), "default", "missing")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetPod(default/missing) err = %v, want ErrNotFound", err)
	}
	if err.Error() != "pod default/missing not found" {
		t.Errorf("not-found message = %q", err.Error())
	}
}

func TestNotFoundIsAStatus(t *testing.T) {
	sock := startServer(t, &fakeProvider{})
	body := rawGet(t, sock, "/api/v1/namespaces/default/pods/x", http.StatusNotFound)
	var st metav1.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("404 body %q is not JSON: %v", body, err)
	}
	if st.Kind != "Status" || st.Code != 404 || st.Reason != metav1.StatusReasonNotFound || st.Message != "pod default/x not found" {
		t.Errorf("status = %+v", st)
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	sock := startServer(t, &fakeProvider{})
	body := rawGet(t, sock, "/api/v1/services", http.StatusNotFound)
	if !strings.Contains(body, `"kind":"Status"`) {
		t.Errorf("unknown route body = %s, want a Status", body)
	}

	resp := rawDo(t, sock, http.MethodDelete, "/api/v1/namespaces/default/pods/x")
	if resp.code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE pod: code %d, want 405; body %s", resp.code, resp.body)
	}
	if !strings.Contains(resp.body, `"reason":"MethodNotAllowed"`) {
		t.Errorf("DELETE pod body = %s, want a MethodNotAllowed Status", resp.body)
	}
	if resp.allow != "GET, HEAD" {
		t.Errorf("Allow = %q", resp.allow)
	}

	resp = rawDo(t, sock, http.MethodPost, "/nowhere")
	if resp.code != http.StatusNotFound {
		t.Errorf("POST /nowhere: code %d, want 404", resp.code)
	}
}

func TestHealthAndReady(t *testing.T) {
	p := &fakeProvider{ready: errors.New("containerd not reachable at /run/containerd/containerd.sock")}
	sock := startServer(t, p)
	c := NewClient(sock)

	if body := rawGet(t, sock, "/healthz", http.StatusOK); strings.TrimSpace(body) != "ok" {
		t.Errorf("healthz body %q", body)
	}
	if body := rawGet(t, sock, "/readyz", http.StatusServiceUnavailable); !strings.Contains(body, "containerd not reachable") {
		t.Errorf("readyz 503 body %q lacks the reason", body)
	}
	if err := c.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "containerd not reachable") {
		t.Errorf("client Ready() = %v, want the reason", err)
	}

	p.setReady(nil)
	if body := rawGet(t, sock, "/readyz", http.StatusOK); strings.TrimSpace(body) != "ok" {
		t.Errorf("readyz body %q", body)
	}
	if err := c.Ready(context.Background()); err != nil {
		t.Errorf("client Ready() = %v, want nil", err)
	}
}

func TestSocketModeAndParentDir(t *testing.T) {
	sock := startServer(t, &fakeProvider{})
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, want socket 0600", fi.Mode())
	}
	di, err := os.Stat(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o755 {
		t.Errorf("created parent dir mode = %v, want 0755", di.Mode().Perm())
	}
	// The temporary bind directory must not be left behind.
	ents, err := os.ReadDir(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("socket dir holds %v, want only the socket", names)
	}
}

func TestSecondServeOnLiveSocketFails(t *testing.T) {
	p := &fakeProvider{pods: []v1.Pod{pod("default", "a")}}
	sock := startServer(t, p)

	err := NewServer(p, nil).Serve(context.Background(), sock)
	if err == nil || !strings.Contains(err.Error(), "already serving on "+sock) {
		t.Fatalf("second Serve = %v, want an 'already serving' error", err)
	}
	// The first server must be untouched.
	if _, err := NewClient(sock).GetPod(context.Background(), "default", "a"); err != nil {
		t.Errorf("first server broken after second Serve: %v", err)
	}
}

func TestStaleSocketIsReplaced(t *testing.T) {
	sock := filepath.Join(shortDir(t), "mqlet.sock")
	// A socket file with nobody listening: what a killed agent leaves.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}

	stop := serveAt(t, &fakeProvider{pods: []v1.Pod{pod("default", "a")}}, sock)
	if _, err := NewClient(sock).GetPod(context.Background(), "default", "a"); err != nil {
		t.Errorf("GetPod through replaced socket: %v", err)
	}
	stop()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still present after shutdown: %v", err)
	}
}

func TestRefusesToReplaceNonSocket(t *testing.T) {
	sock := filepath.Join(shortDir(t), "mqlet.sock")
	if err := os.WriteFile(sock, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := NewServer(&fakeProvider{}, nil).Serve(context.Background(), sock)
	if err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Serve over a regular file = %v, want a 'not a socket' error", err)
	}
	if b, _ := os.ReadFile(sock); string(b) != "precious" {
		t.Errorf("regular file was clobbered: %q", b)
	}
}

func TestClientErrorWhenNoAgent(t *testing.T) {
	sock := filepath.Join(shortDir(t), "mqlet.sock")
	c := NewClient(sock)
	_, err := c.ListPods(context.Background(), "")
	if err == nil {
		t.Fatal("ListPods with no agent succeeded")
	}
	want := `cannot reach the mqlet agent at ` + sock + ` (is "mqlet agent" running? use --api-socket): `
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %q, want prefix %q", err, want)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %v does not wrap the dial cause (ENOENT)", err)
	}
	if errors.Is(err, ErrNotFound) {
		t.Errorf("an unreachable agent must not look like a missing pod: %v", err)
	}
}

type rawResp struct {
	code  int
	body  string
	allow string
}

func rawDo(t *testing.T, sock, method, path string) rawResp {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://mqlet"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawResp{code: resp.StatusCode, body: string(body), allow: resp.Header.Get("Allow")}
}

func rawGet(t *testing.T, sock, path string, wantCode int) string {
	t.Helper()
	r := rawDo(t, sock, http.MethodGet, path)
	if r.code != wantCode {
		t.Errorf("GET %s: code %d, want %d; body %s", path, r.code, wantCode, r.body)
	}
	return r.body
}
