// Package sysctl decides which kernel parameters a pod may set, with kubelet's rules: the safe set
// every pod may use, the unsafe ones a node's operator allows by name or prefix, and only
// parameters the kernel keeps per namespace, never one that would change the whole node.
package sysctl

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/hw"
)

// Namespace is the kernel namespace that holds a sysctl.
type Namespace string

const (
	IPC     Namespace = "ipc"
	Net     Namespace = "net"
	Unknown Namespace = "" // not known to be namespaced: setting it would change the whole node
)

// NamespaceOf says which namespace holds name (in dot form). Only the IPC and network namespaces
// are known, as in kubelet: others (uts, for one) are set by the runtime itself.
func NamespaceOf(name string) Namespace {
	switch {
	case name == "kernel.sem",
		strings.HasPrefix(name, "kernel.shm"),
		strings.HasPrefix(name, "kernel.msg"),
		strings.HasPrefix(name, "fs.mqueue."):
		return IPC
	case strings.HasPrefix(name, "net."):
		return Net
	}
	return Unknown
}

// Normalize turns the slash form of a name (net/ipv4/conf/eth0.100/forwarding) into the dot form
// (net.ipv4.conf.eth0/100.forwarding) that /proc/sys paths and the allowlist use; a name whose
// first separator is a dot is already in dot form.
func Normalize(name string) string {
	i := strings.IndexAny(name, "./")
	if i < 0 || name[i] == '.' {
		return name
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '.':
			return '/'
		case '/':
			return '.'
		}
		return r
	}, name)
}

// MaxLength is the longest name the API server accepts.
const MaxLength = 253

var (
	namePattern = regexp.MustCompile(`^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$`)
	// A pattern's last segment may end in * after part of a word: kernel.msg*, net.*.
	patternPattern = regexp.MustCompile(`^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]$`)
)

// ValidName reports whether name is a syntactically valid sysctl name (dot or slash form).
func ValidName(name string) bool { return len(name) <= MaxLength && namePattern.MatchString(name) }

// safe is kubelet's safe set: namespaced and isolated, so one pod setting them affects no other.
// Some became namespaced in a given kernel; before it they would change the node.
var safe = []struct {
	name         string
	major, minor int // first kernel where the sysctl is namespaced; 0.0: always
}{
	{"kernel.shm_rmid_forced", 0, 0},
	{"net.ipv4.ip_local_port_range", 0, 0},
	{"net.ipv4.tcp_syncookies", 0, 0},
	{"net.ipv4.ping_group_range", 0, 0},
	{"net.ipv4.ip_unprivileged_port_start", 0, 0},
	{"net.ipv4.ip_local_reserved_ports", 3, 16},
	{"net.ipv4.tcp_keepalive_time", 4, 5},
	{"net.ipv4.tcp_fin_timeout", 4, 6},
	{"net.ipv4.tcp_keepalive_intvl", 4, 5},
	{"net.ipv4.tcp_keepalive_probes", 4, 5},
	{"net.ipv4.tcp_rmem", 0, 0},
	{"net.ipv4.tcp_wmem", 0, 0},
}

// Safe returns the safe sysctls on a kernel of the given release (as uname -r prints it). A
// release that cannot be read keeps only those namespaced on every kernel, as kubelet does.
func Safe(release string) []string {
	major, minor, ok := parseRelease(release)
	var out []string
	for _, s := range safe {
		if s.major == 0 || ok && (major > s.major || major == s.major && minor >= s.minor) {
			out = append(out, s.name)
		}
	}
	return out
}

func parseRelease(r string) (major, minor int, ok bool) {
	parts := strings.SplitN(r, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	end := strings.IndexFunc(parts[1], func(c rune) bool { return c < '0' || c > '9' })
	if end < 0 {
		end = len(parts[1])
	}
	minor, err2 := strconv.Atoi(parts[1][:end])
	return major, minor, err1 == nil && err2 == nil
}

// Allowlist is the sysctls pods may set on a node: names and prefixes (a pattern ending in *).
type Allowlist struct {
	names    map[string]Namespace
	prefixes map[string]Namespace
}

// NewAllowlist builds an allowlist from names and patterns ending in *. Each must be namespaced:
// allowing one that is not would let a pod change the node (kubelet refuses to start then too).
func NewAllowlist(patterns []string) (*Allowlist, error) {
	a := &Allowlist{names: map[string]Namespace{}, prefixes: map[string]Namespace{}}
	for _, p := range patterns {
		if len(p) > MaxLength || !patternPattern.MatchString(p) {
			return nil, fmt.Errorf("sysctl pattern %q: not a sysctl name (such as net.core.somaxconn) or a prefix ending in * (such as net.core.* or kernel.msg*)", p)
		}
		n := Normalize(p)
		if prefix, ok := strings.CutSuffix(n, "*"); ok {
			ns := NamespaceOf(prefix)
			if ns == Unknown {
				return nil, fmt.Errorf("sysctl pattern %q: these sysctls are not known to be namespaced; a pod setting them would change the whole node", p)
			}
			a.prefixes[prefix] = ns
			continue
		}
		ns := NamespaceOf(n)
		if ns == Unknown {
			return nil, fmt.Errorf("sysctl %q is not known to be namespaced; a pod setting it would change the whole node", p)
		}
		a.names[n] = ns
	}
	return a, nil
}

// NodeAllowlist is the allowlist of this node: the safe set its kernel supports plus the unsafe
// patterns its operator allows (the agent config's allowedUnsafeSysctls).
func NodeAllowlist(unsafe []string) (*Allowlist, error) {
	return NewAllowlist(append(Safe(hw.KernelVersion("/")), unsafe...))
}

// Namespaced allows every namespaced sysctl: for checks made away from the node (mqlet ctl), which
// cannot know what the node allows and must refuse only what no node would accept.
func Namespaced() *Allowlist {
	a, _ := NewAllowlist([]string{"kernel.sem", "kernel.shm*", "kernel.msg*", "fs.mqueue.*", "net.*"})
	return a
}

// Check says why a pod may not set name (either form), or nil. A pod that shares the host's
// network or IPC namespace may set no sysctl of that namespace: it would be the node's.
func (a *Allowlist) Check(name string, hostNet, hostIPC bool) error {
	n := Normalize(name)
	ns, ok := a.names[n]
	if !ok {
		// The longest matching prefix, so the answer does not depend on map order.
		best := ""
		for p, pns := range a.prefixes {
			if strings.HasPrefix(n, p) && len(p) >= len(best) {
				best, ns, ok = p, pns, true
			}
		}
	}
	if !ok {
		if NamespaceOf(n) == Unknown {
			return fmt.Errorf("%q is not a namespaced sysctl: it would change the whole node", n)
		}
		return fmt.Errorf("%q is not in the safe set nor allowed by the node's allowedUnsafeSysctls", n)
	}
	if ns == IPC && hostIPC {
		return fmt.Errorf("%q is not allowed with hostIPC: it would change the host's IPC namespace", n)
	}
	if ns == Net && hostNet {
		return fmt.Errorf("%q is not allowed with hostNetwork: it would change the host's network namespace", n)
	}
	return nil
}

// Names lists what the allowlist holds, sorted, prefixes with their *: for messages and tests.
func (a *Allowlist) Names() []string {
	out := make([]string, 0, len(a.names)+len(a.prefixes))
	for n := range a.names {
		out = append(out, n)
	}
	for p := range a.prefixes {
		out = append(out, p+"*")
	}
	slices.Sort(out)
	return out
}
