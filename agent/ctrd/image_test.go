package ctrd

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestNormalizeImage(t *testing.T) {
	for in, want := range map[string]string{
		"busybox":                    "docker.io/library/busybox:latest",
		"busybox:1.36":               "docker.io/library/busybox:1.36",
		"127.0.0.1:5000/mqlet/app:1": "127.0.0.1:5000/mqlet/app:1",
		"mqlet.test/busybox:1":       "mqlet.test/busybox:1",
		"ghcr.io/org/app@sha256:" + strings.Repeat("a", 64): "ghcr.io/org/app@sha256:" + strings.Repeat("a", 64),
	} {
		if got, err := NormalizeImage(in); err != nil || got != want {
			t.Errorf("NormalizeImage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := NormalizeImage("Not A Ref"); err == nil {
		t.Errorf("NormalizeImage of an invalid name: no error")
	}
}

// A registry that sends headers and then nothing: the body read must end with the stall error,
// naming the URL, once the stall timer fires; data sent before the stall still comes through.
func TestStallBody(t *testing.T) {
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "abc")
		w.(http.Flusher).Flush()
		select { // hold the connection open, sending nothing, until the client gives up
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })

	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	c := &http.Client{Transport: stallTransport{base: base, stall: 500 * time.Millisecond}}
	url := srv.URL + "/v2/x/blobs/y"
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	type result struct {
		data []byte
		err  error
	}
	got := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(resp.Body)
		got <- result{b, err}
	}()
	var res result
	select {
	case res = <-got:
	case <-time.After(waitLimit):
		t.Fatalf("reading a stalled body of %s did not end within %s: the stall timer did not fire", url, waitLimit)
	}
	if string(res.data) != "abc" {
		t.Errorf("data before the stall = %q, want %q", res.data, "abc")
	}
	if !errors.Is(res.err, errRegistryStalled) || !strings.Contains(res.err.Error(), "/v2/x/blobs/y") {
		t.Errorf("stalled read error = %v, want the stall error naming the URL", res.err)
	}
	if !registryUnreachable(res.err) {
		t.Errorf("registryUnreachable(%v) = false: a stalled registry must count as unreachable", res.err)
	}
}

// waitLimit bounds waits that only matter when a test is failing.
const waitLimit = 10 * time.Second

// Only failures to reach a registry may fall back to a local copy. Each case is a real failure of
// the resolver that pulls use, against a server (or no server) that fails that way.
func TestRegistryUnreachable(t *testing.T) {
	unknownCA := httptest.NewUnstartedServer(http.NotFoundHandler()) // its certificate's CA is trusted by no one
	unknownCA.Config.ErrorLog = log.New(io.Discard, "", 0)           // the refused handshake is the point
	unknownCA.StartTLS()
	t.Cleanup(unknownCA.Close)
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
	}))
	t.Cleanup(auth.Close)
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "denied", http.StatusForbidden)
	}))
	t.Cleanup(forbidden.Close)
	missing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return // a registry, but without the image
		}
		http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
	}))
	t.Cleanup(missing.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close() // nothing listens there any more: connection refused

	host := func(s *httptest.Server) string {
		return strings.TrimPrefix(strings.TrimPrefix(s.URL, "https://"), "http://")
	}
	r := &Runtime{opts: Options{Registry: RegistryOptions{PlainHTTP: []string{host(auth), host(forbidden), host(missing), closed}}}}
	res, err := r.resolver()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name        string
		host        string
		unreachable bool
	}{
		{"connection refused", closed, true},
		{"no DNS answer", "registry.invalid:5000", true},
		{"unknown CA", host(unknownCA), false},
		{"401", host(auth), false},
		{"403", host(forbidden), false},
		{"not found", host(missing), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ref := tt.host + "/mqlet/busybox:1"
			_, _, err := res.Resolve(ctx, ref)
			if err == nil {
				t.Fatalf("resolving %s succeeded; the case needs a failure", ref)
			}
			if got := registryUnreachable(err); got != tt.unreachable {
				t.Errorf("registryUnreachable(%v) = %v, want %v", err, got, tt.unreachable)
			}
		})
	}
}
