package prom

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The TCP endpoint on a real loopback port: the three paths answer, nothing else does, and Serve
// ends when its context does.
func TestServeTCP(t *testing.T) {
	r := NewRegistry()
	r.Counter("c_total", "c").Inc()
	health := http.NewServeMux()
	health.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "healthy\n") })
	health.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ready\n") })
	health.HandleFunc("GET /api/v1/pods", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "secret pod specs\n") })

	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, Endpoints(r.Handler(), health), nil) }()
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "c_total 1") {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, body := get("/healthz"); code != 200 || body != "healthy\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	for _, p := range []string{"/api/v1/pods", "/", "/metrics/x"} {
		if code, body := get(p); code != http.StatusNotFound || strings.Contains(body, "secret") {
			t.Errorf("%s: %d %q, want 404 without the API's answer", p, code, body)
		}
	}
	resp, err := http.Post(base+"/metrics", "text/plain", nil)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("POST /metrics answered 200")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Error("still listening after Serve returned")
	}
}

func TestListenNamesTheAddress(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	_, err = Listen(addr)
	if err == nil || !strings.Contains(err.Error(), "metrics address "+addr) {
		t.Errorf("listening on a taken port: %v, want an error naming %s", err, addr)
	}
}

// A client that sends half a request header and then nothing is cut off by the header timeout
// instead of holding its connection (and a goroutine) for good.
func TestServeDropsStalledClients(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, Endpoints(NewRegistry().Handler(), http.NotFoundHandler()), nil) }()
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n") // the header never ends
	// The test's own bound is well past the server's: the positive signal is the server closing.
	c.SetReadDeadline(time.Now().Add(readHeaderTimeout + 10*time.Second))
	_, err = io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("server still held a stalled connection after %v", readHeaderTimeout+10*time.Second)
	}
}
