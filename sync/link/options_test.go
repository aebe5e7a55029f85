package link

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewValidates(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	ok := Options{Broker: "tcp://127.0.0.1:1883", ClientID: "node-a"}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string // a substring of the error
	}{
		{"empty broker", func(o *Options) { o.Broker = "" }, "broker URL is empty"},
		{"bad scheme", func(o *Options) { o.Broker = "http://x:1" }, `scheme "http"`},
		{"no host", func(o *Options) { o.Broker = "tcp://:1883" }, "no host"},
		{"no client id", func(o *Options) { o.ClientID = "" }, "client ID"},
		{"password alone", func(o *Options) { o.Password = "x" }, "password without a username"},
		{"min above max", func(o *Options) { o.ReconnectMin, o.ReconnectMax = 10e9, 1e9 }, "reconnect min 10s is above reconnect max 1s"},
		{"short keepalive", func(o *Options) { o.Keepalive = 1e6 }, "keepalive 1ms"},
		{"bad filter", func(o *Options) { o.Subscriptions = []string{"a/#/b"} }, `"a/#/b"`},
		{"bad plus", func(o *Options) { o.Subscriptions = []string{"a/b+"} }, `"a/b+"`},
		{"duplicate filter", func(o *Options) { o.Subscriptions = []string{"a/#", "a/#"} }, "listed twice"},
		{"liveness without funcs", func(o *Options) { o.LivenessTopic = "n/status" }, "needs Online"},
		{"liveness wildcard", func(o *Options) { o.LivenessTopic = "n/+" }, "wildcards"},
		{"TLS files on tcp", func(o *Options) { o.CAFile = garbage }, "scheme is not"},
		{"missing CA file", func(o *Options) { o.Broker, o.CAFile = "ssl://h:8883", missing }, missing},
		{"garbage CA file", func(o *Options) { o.Broker, o.CAFile = "ssl://h:8883", garbage }, garbage},
		{"cert without key", func(o *Options) { o.Broker, o.CertFile = "ssl://h:8883", garbage }, "both or neither"},
		{"garbage cert", func(o *Options) { o.Broker, o.CertFile, o.KeyFile = "ssl://h:8883", garbage, missing }, garbage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			_, err := New(o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
