package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/loopback"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testenv"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape GETs url through hc and parses the answer as Prometheus does (strict names).
func scrape(t *testing.T, hc *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("GET %s: Content-Type %q", url, ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("GET %s is not Prometheus text: %v\n%s", url, err, body)
	}
	return fams
}

// sampleOf returns the value of family name's sample with exactly these labels (a histogram's count).
func sampleOf(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.Metric {
		if len(m.Label) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.Label {
			if labels[l.GetName()] != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		default:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

func unixHTTP(sock string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
}

// The real agent, a pod pulled from the local registry and running on the real containerd:
// /metrics on the API socket and on the TCP address parses as Prometheus text and counts the
// running pod, the pull, the syncs and the store writes; the TCP address serves /healthz and
// /readyz but not the pod API; it closes when the agent stops.
func TestMetricsOfARunningAgent(t *testing.T) {
	h := newHarness(t)
	ports, err := loopback.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	ref := h.env.RegistryRef(testenv.RegistryBusybox2)
	h.writeManifest("metered.yaml", `apiVersion: v1
kind: Pod
metadata: {name: metered}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: `+ref+`
    command: ["sleep", "3600"]
`)
	h.startAgent("--metrics-address", addr)
	h.waitPod("metered", "running", allRunning)
	// The API shows the Running status as the worker publishes it, before the worker's sync has
	// ended (and been timed) and before the status's store write has: wait for both figures.
	var local map[string]*dto.MetricFamily
	waitFor(t, "the pod's sync and status write counted", func() bool {
		local = scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
		syncs, _ := sampleOf(local, "mqlet_pod_sync_duration_seconds", nil)
		writes, _ := sampleOf(local, "mqlet_store_write_duration_seconds", map[string]string{"operation": "put_status"})
		return syncs >= 1 && writes >= 1
	})
	want := func(fams map[string]*dto.MetricFamily, where, name string, labels map[string]string, ok func(float64) bool, what string) {
		t.Helper()
		v, found := sampleOf(fams, name, labels)
		if !found || !ok(v) {
			t.Errorf("%s: %s%v = %v (found %v), want %s", where, name, labels, v, found, what)
		}
	}
	eq := func(x float64) func(float64) bool { return func(v float64) bool { return v == x } }
	atLeast := func(x float64) func(float64) bool { return func(v float64) bool { return v >= x } }
	for where, fams := range map[string]map[string]*dto.MetricFamily{
		"api socket": local,
		"tcp":        scrape(t, http.DefaultClient, "http://"+addr+"/metrics"),
	} {
		want(fams, where, "mqlet_pods", map[string]string{"phase": "Running"}, eq(1), "1")
		want(fams, where, "mqlet_pods", map[string]string{"phase": "Pending"}, eq(0), "0")
		want(fams, where, "mqlet_containers", map[string]string{"state": "running"}, eq(1), "1")
		want(fams, where, "mqlet_container_restarts_total", map[string]string{"namespace": "default", "pod": "metered", "container": "main"}, eq(0), "0")
		want(fams, where, "mqlet_image_pulls_total", map[string]string{"result": "success"}, eq(1), "1 (the pull from the registry)")
		want(fams, where, "mqlet_image_pulls_total", map[string]string{"result": "failure"}, eq(0), "0")
		want(fams, where, "mqlet_pod_sync_duration_seconds", nil, atLeast(1), "at least one sync")
		want(fams, where, "mqlet_store_write_duration_seconds", map[string]string{"operation": "update_desired"}, atLeast(1), "the pod stored")
		want(fams, where, "mqlet_store_write_duration_seconds", map[string]string{"operation": "put_status"}, atLeast(1), "its status stored")
		want(fams, where, "mqlet_pod_evictions_total", map[string]string{"eviction_signal": "memory.available"}, eq(0),
			"0 (kubelet's default threshold is set; nothing was evicted)")
		want(fams, where, "process_resident_memory_bytes", nil, atLeast(1<<20), "over 1 MiB")
		want(fams, where, "process_cpu_seconds_total", nil, func(v float64) bool { return v > 0 }, "> 0")
		want(fams, where, "go_goroutines", nil, atLeast(1), ">= 1")
		if fams["mqlet_build_info"] == nil {
			t.Errorf("%s: no mqlet_build_info", where)
		}
		if fams["mqlet_mqtt_connected"] != nil {
			t.Errorf("%s: MQTT figures on a node without a broker", where)
		}
	}

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := get(p); code != 200 || strings.TrimSpace(body) != "ok" {
			t.Errorf("tcp %s: %d %q", p, code, body)
		}
	}
	for _, p := range []string{"/api/v1/pods", "/api/v1/namespaces/default/pods/metered", "/api/v1/namespaces/default/pods/metered/log"} {
		if code, body := get(p); code != http.StatusNotFound || strings.Contains(body, "metered") {
			t.Errorf("tcp %s: %d %q, want 404 and nothing of the pod", p, code, body)
		}
	}
	// The pod API is still on the socket.
	if pods, err := h.client.ListPods(context.Background(), ""); err != nil || len(pods.Items) != 1 {
		t.Errorf("api socket pods: %v %v", pods, err)
	}

	h.stopAgent()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after the agent stopped", addr)
	}
}

// A metrics address that cannot be listened on stops the agent at start with an error naming it,
// and the pod the agent ran before keeps running.
func TestMetricsAddressTakenFailsStart(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("keep.yaml", sleeper("keep", "3600"))
	h.startAgent()
	before := h.waitPod("keep", "running", allRunning)
	h.stopAgent()
	pidBefore := h.tasks()[strings.TrimPrefix(containerStatus(before, "c").ContainerID, "containerd://")]

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, h.bin, append(append([]string{"agent"}, h.flags()...), "--metrics-address", addr)...).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("agent with a taken metrics address: err %v (timed out: %v)\n%s", err, ctx.Err() != nil, out)
	}
	if !strings.Contains(string(out), "metrics address "+addr) || !strings.Contains(string(out), "--metrics-address") {
		t.Errorf("error does not name the address and flag:\n%s", out)
	}
	id := strings.TrimPrefix(containerStatus(before, "c").ContainerID, "containerd://")
	pids := h.tasks()
	if id == "" || pids[id] == 0 || pids[id] != pidBefore {
		t.Errorf("container %q of the running pod (pid %d before) after the failed start: tasks %v", id, pidBefore, pids)
	}
}

// With a real broker: the link's state and the outbox's depth follow the broker going away and
// coming back. While it is down, a new pod's statuses wait in the outbox; when it returns they are
// drained.
func TestMetricsOfTheMQTTLink(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	h.writeManifest("first.yaml", sleeper("first", "3600"))
	h.startMQTTAgent(b.Plain)
	h.waitPod("first", "running", allRunning)
	hc := unixHTTP(h.sock)
	figure := func(name string) (float64, bool) {
		return sampleOf(scrape(t, hc, "http://mqlet/metrics"), name, nil)
	}
	is := func(name string, want float64) func() bool {
		return func() bool { v, ok := figure(name); return ok && v == want }
	}
	waitFor(t, "mqlet_mqtt_connected 1", is("mqlet_mqtt_connected", 1))
	waitFor(t, "outbox drained", is("mqlet_mqtt_outbox_entries", 0))
	if v, ok := figure("mqlet_mqtt_outbox_bytes"); !ok || v != 0 {
		t.Errorf("outbox bytes %v (found %v) with no entries", v, ok)
	}

	b.Stop(t)
	waitFor(t, "mqlet_mqtt_connected 0 with the broker stopped", is("mqlet_mqtt_connected", 0))
	h.writeManifest("second.yaml", sleeper("second", "3600"))
	h.waitPod("second", "running", allRunning)
	waitFor(t, "the new pod's status queued in the outbox", func() bool {
		v, ok := figure("mqlet_mqtt_outbox_entries")
		return ok && v > 0
	})
	if v, ok := figure("mqlet_mqtt_outbox_bytes"); !ok || v <= 0 {
		t.Errorf("outbox bytes %v (found %v) with entries queued", v, ok)
	}

	b.Start(t)
	waitFor(t, "mqlet_mqtt_connected 1 after the broker returned", is("mqlet_mqtt_connected", 1))
	waitFor(t, "outbox drained after the broker returned", is("mqlet_mqtt_outbox_entries", 0))
	if v, ok := sampleOf(scrape(t, hc, "http://mqlet/metrics"), "mqlet_store_write_duration_seconds", map[string]string{"operation": "outbox_put"}); !ok || v < 1 {
		t.Errorf("outbox writes not timed: %v (found %v)", v, ok)
	}
}
