package main

import (
	"bytes"
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
	o := r.options(nil)
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
