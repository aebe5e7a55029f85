package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

// parse parses args as main does, without exiting.
func parse(t *testing.T, args ...string) (*cli, *kong.Context, error) {
	t.Helper()
	var c cli
	var out bytes.Buffer
	p, err := parser(&c, kong.Writers(&out, &out), kong.Exit(func(int) {}))
	if err != nil {
		t.Fatalf("parser: %v", err)
	}
	kctx, err := p.Parse(args)
	return &c, kctx, err
}

func TestDefaultsAndFlags(t *testing.T) {
	c, kctx, err := parse(t, "--mqtt-broker", "ssl://broker:8883", "--no-leader-elect", "--node-selector", "site=a",
		"--node-lease-renew-interval", "5s", "--topic-prefix", "acme/v1", "--mqtt-username", "bridge-1")
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if kctx.Command() != "run" {
		t.Errorf("command %q, want run (the default)", kctx.Command())
	}
	r := c.Run
	if r.LeaderElect || r.NodeSelector != "site=a" || r.NodeLeaseRenewInterval != 5*time.Second || r.TopicPrefix != "acme/v1" {
		t.Errorf("flags not taken: %+v", r)
	}
	if r.KubeAPIQPS != 200 || r.KubeAPIBurst != 400 || r.NodeLeaseDuration != 40*time.Second ||
		r.NodeStatusReportFrequency != 5*time.Minute || r.NodeRoleLabel != "node-role.kubernetes.io/edge" || r.MetricsAddr != "127.0.0.1:10360" {
		t.Errorf("defaults: %+v", r)
	}
	o := r.options(nil, nil, nil)
	if o.MQTT.Broker != "ssl://broker:8883" || o.MQTT.Username != "bridge-1" || o.NoRoleLabel {
		t.Errorf("options: %+v", o)
	}
	c, _, err = parse(t, "--mqtt-broker", "tcp://b:1883")
	if err != nil || !c.Run.LeaderElect {
		t.Errorf("leader election must default to on: %v %v", c.Run.LeaderElect, err)
	}
}

func TestBadFlagsSayWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mqtt-broker", "tcp://b", "--nope"}, "unknown flag --nope"},
		{[]string{}, "--mqtt-broker"},
		{[]string{"--mqtt-broker", "tcp://b", "--log-level", "loud"}, "--log-level"},
		{[]string{"--mqtt-broker", "tcp://b", "--node-lease-renew-interval", "ten"}, "--node-lease-renew-interval"},
		{[]string{"--mqtt-broker", "tcp://b", "--mqtt-password-file", "/nonexistent/pw"}, "/nonexistent/pw"},
	} {
		_, _, err := parse(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %q", tc.args, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-lease-renew-interval", "40s"}, "shorter than --node-lease-duration"},
		{[]string{"--node-lease-duration", "40500ms"}, "whole seconds"},
		{[]string{"--leader-elect-renew-deadline", "20s"}, "lease duration"},
		{[]string{"--kube-api-qps", "0"}, "--kube-api-qps"},
		{[]string{"--mqtt-cert-file", "main.go"}, "--mqtt-key-file"},
	} {
		c, _, err := parse(t, append([]string{"--mqtt-broker", "tcp://b"}, tc.args...)...)
		if err != nil {
			t.Fatalf("%q: parse: %v", tc.args, err)
		}
		if err := c.Run.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: validate %v, want one naming %q", tc.args, err, tc.want)
		}
	}
}

// runBridge runs the command line as main does and returns the exit status and what was printed.
func runBridge(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	status = run(args, &runEnv{ctx: context.Background(), stdout: &out, stderr: &errOut})
	return status, out.String(), errOut.String()
}

// --version and version print the version that also goes into the bridge's user agent; a bad
// command line is one error line and a hint, exit 1 (not kong's 80 after the whole usage).
func TestVersionAndUsageErrors(t *testing.T) {
	want := "mqlet-bridge " + version + " (commit " + commit + ")\n"
	for _, args := range [][]string{{"--version"}, {"version"}, {"--mqtt-broker", "tcp://b", "--version"}} {
		if status, out, errOut := runBridge(t, args...); status != 0 || out != want || errOut != "" {
			t.Errorf("mqlet-bridge %q = %d, %q, %q; want 0, %q", args, status, out, errOut, want)
		}
	}
	if !strings.HasPrefix(version, "v0.0.0-dev") {
		t.Errorf("an unstamped test build's version %q, want v0.0.0-dev...", version)
	}
	c, _, err := parse(t, "--mqtt-broker", "tcp://b")
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Run.options(nil, nil, nil); o.Version != version {
		t.Errorf("bridge options carry version %q (the user agent's), want %q", o.Version, version)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--mqtt-broker", "tcp://b", "--nope"}, "mqlet-bridge: unknown flag --nope"},
		{[]string{}, "mqlet-bridge: missing flags: --mqtt-broker"},
		{[]string{"--mqtt-broker", "tcp://b", "--kube-api-qps", "0"}, "mqlet-bridge: --kube-api-qps 0: must be positive"},
	} {
		status, out, errOut := runBridge(t, tc.args...)
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if status != 1 || out != "" || !strings.HasPrefix(lines[0], tc.msg) || len(lines) > 2 {
			t.Errorf("mqlet-bridge %q = %d, %q, stderr:\n%s\nwant 1 and %q (and a hint)", tc.args, status, out, errOut, tc.msg)
		}
	}
}

func TestKubeletFlags(t *testing.T) {
	r := RunCmd{KubeletPorts: "10300-10302,10310", KubeletAddress: "10.0.0.7"}
	k, err := r.kubeletOptions(nil)
	if err != nil || k == nil || k.Address != "10.0.0.7" || len(k.Ports) != 4 {
		t.Fatalf("kubeletOptions: %+v %v", k, err)
	}
	if k, err := (&RunCmd{KubeletPorts: "none"}).kubeletOptions(nil); k != nil || err != nil {
		t.Errorf("--kubelet-ports none: %+v %v, want no kubelet API", k, err)
	}
	t.Setenv("POD_IP", "10.1.2.3")
	if k, err := (&RunCmd{KubeletPorts: "10300"}).kubeletOptions(nil); err != nil || k.Address != "10.1.2.3" {
		t.Errorf("default address: %+v %v, want $POD_IP", k, err)
	}
	for _, bad := range []RunCmd{{KubeletPorts: "10300-10200"}, {KubeletPorts: "10300", KubeletAddress: "bridge.example"}} {
		if _, err := bad.kubeletOptions(nil); err == nil || !strings.Contains(err.Error(), "--kubelet-") {
			t.Errorf("%+v: %v, want an error naming the flag", bad, err)
		}
	}
}
