package sysctl

import (
	"slices"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"net.ipv4.tcp_syncookies":           "net.ipv4.tcp_syncookies",
		"net/ipv4/tcp_syncookies":           "net.ipv4.tcp_syncookies",
		"net/ipv4/conf/eth0.100/forwarding": "net.ipv4.conf.eth0/100.forwarding",
		"net.ipv4.conf.eth0/100.forwarding": "net.ipv4.conf.eth0/100.forwarding",
		"kernel":                            "kernel",
	} {
		if got := Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSafeByKernel(t *testing.T) {
	old := Safe("4.4.0-generic")
	if slices.Contains(old, "net.ipv4.tcp_fin_timeout") || slices.Contains(old, "net.ipv4.tcp_keepalive_time") || !slices.Contains(old, "net.ipv4.ip_local_reserved_ports") {
		t.Errorf("Safe(4.4) = %v: want ip_local_reserved_ports (3.16) but not tcp_keepalive_time (4.5) or tcp_fin_timeout (4.6)", old)
	}
	if got := Safe("6.18.44-fc-v445"); len(got) != len(safe) {
		t.Errorf("Safe(6.18) = %v, want all %d", got, len(safe))
	}
	if got := Safe(""); slices.Contains(got, "net.ipv4.tcp_keepalive_time") || !slices.Contains(got, "kernel.shm_rmid_forced") {
		t.Errorf("Safe(unknown) = %v, want only those namespaced on every kernel", got)
	}
}

func TestAllowlist(t *testing.T) {
	a, err := NewAllowlist(append(Safe("6.1"), "net.core.*", "kernel.msgmax"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name             string
		hostNet, hostIPC bool
		want             string // "" allowed, else a substring of the refusal
	}{
		{name: "net.ipv4.ip_local_port_range"},
		{name: "net/ipv4/ip_local_port_range"},
		{name: "net.core.somaxconn"},
		{name: "kernel.msgmax"},
		{name: "kernel.shm_rmid_forced"},
		{name: "net.ipv4.ip_forward", want: "not in the safe set"},
		{name: "kernel.msgmnb", want: "not in the safe set"},
		{name: "vm.swappiness", want: "not a namespaced sysctl"},
		{name: "net.core.somaxconn", hostNet: true, want: "hostNetwork"},
		{name: "net.ipv4.tcp_syncookies", hostNet: true, want: "hostNetwork"},
		{name: "kernel.shm_rmid_forced", hostIPC: true, want: "hostIPC"},
		{name: "kernel.shm_rmid_forced", hostNet: true},
	}
	for _, tt := range tests {
		err := a.Check(tt.name, tt.hostNet, tt.hostIPC)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("Check(%s, hostNet %v, hostIPC %v) = %v, want allowed", tt.name, tt.hostNet, tt.hostIPC, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("Check(%s, hostNet %v, hostIPC %v) = %v, want a refusal mentioning %q", tt.name, tt.hostNet, tt.hostIPC, err, tt.want)
		}
	}
	for _, bad := range []string{"vm.*", "kernel.hostname", "fs.file-max", "Net.core.x", "net..x"} {
		if _, err := NewAllowlist([]string{bad}); err == nil {
			t.Errorf("NewAllowlist(%q) accepted", bad)
		}
	}
	if err := Namespaced().Check("net.ipv4.ip_forward", false, false); err != nil {
		t.Errorf("Namespaced refuses a namespaced sysctl: %v", err)
	}
}
