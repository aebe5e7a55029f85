package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// This file removes what mqlet's default network leaves on the host once no pod uses it (`mqlet
// uninstall --purge`): its configuration file, its bridge, and iptables rules of its pods that a
// CNI DEL never removed (an agent killed in the middle of a teardown). Each part touches only what
// is recognisably mqlet's: a conflist with the default network's name and bridge, a bridge device
// of that name, rules whose comment names the network (the bridge and portmap plugins put
// `name: "<network>" id: "<container>"` on every rule they add).

// RemoveDefault removes DefaultConfFile from dir when it holds d's network (its name, and its first
// plugin a bridge on d.Bridge), as WriteDefault wrote it; a file the operator put there under that
// name for another network is kept. It reports whether it removed the file.
func RemoveDefault(dir string, d DefaultNetwork) (bool, error) {
	path := filepath.Join(dir, DefaultConfFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if !isDefault(data, d) {
		return false, nil
	}
	if err := os.Remove(path); err != nil {
		return false, fmt.Errorf("remove %s: %w", path, err)
	}
	return true, nil
}

func isDefault(data []byte, d DefaultNetwork) bool {
	var list struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
		} `json:"plugins"`
	}
	if json.Unmarshal(data, &list) != nil {
		return false
	}
	return list.Name == d.Name && len(list.Plugins) > 0 && list.Plugins[0].Type == "bridge" && list.Plugins[0].Bridge == d.Bridge
}

// DeleteBridge deletes the bridge device name when there is one (the bridge plugin makes it at the
// first pod and never removes it). A device of that name that is not a bridge is left alone and
// reported. It reports whether it deleted the device.
func DeleteBridge(name string) (bool, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return false, nil // no such device
	}
	// The link's kind from netlink, not /sys/class/net: sysfs shows the namespace it was mounted
	// in, which need not be this process's.
	kind, err := linkKind(ifc.Index)
	if err != nil {
		return false, fmt.Errorf("device %s: %w", name, err)
	}
	if kind != "bridge" {
		return false, fmt.Errorf("device %s is a %q, not a bridge; not deleting it", name, kind)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return false, fmt.Errorf("delete bridge %s: netlink socket: %w", name, err)
	}
	defer unix.Close(fd)
	msg := make([]byte, unix.SizeofIfInfomsg)
	msg[0] = unix.AF_UNSPEC
	hostEndian.PutUint32(msg[4:], uint32(ifc.Index))
	if err := netlinkDo(fd, unix.RTM_DELLINK, 0, msg); err != nil && !errors.Is(err, unix.ENODEV) {
		return false, fmt.Errorf("delete bridge %s: %w", name, err)
	}
	return true, nil
}

// Iptables runs an iptables-like command (iptables, ip6tables) with args and returns its output;
// tests replace it.
type Iptables func(cmd string, args ...string) ([]byte, error)

// ExecIptables runs the command from PATH.
func ExecIptables(cmd string, args ...string) ([]byte, error) {
	out, err := exec.Command(cmd, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", cmd, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// RemoveNetworkRules deletes, from the nat and filter tables of iptables and ip6tables (those of
// them that exist), every rule whose comment names network, then flushes and deletes the per-pod
// chains those rules jumped to (CNI-<hash>, CNI-DN-<hash>). Chains the CNI plugins share between
// networks (CNI-HOSTPORT-*) are kept. It returns one line per rule or chain removed.
func RemoveNetworkRules(run Iptables, network string) ([]string, error) {
	var done []string
	var errs []error
	for _, cmd := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(cmd + "-save"); err != nil && run == nil {
			continue
		}
		for _, table := range []string{"nat", "filter"} {
			d, err := removeRules(run, cmd, table, network)
			done = append(done, d...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return done, errors.Join(errs...)
}

func removeRules(run Iptables, cmd, table, network string) ([]string, error) {
	if run == nil {
		run = ExecIptables
	}
	out, err := run(cmd+"-save", "-t", table)
	if err != nil {
		if cmd == "ip6tables" {
			return nil, nil // a kernel without IPv6 tables: nothing of ours there either
		}
		return nil, err
	}
	rules, chains := networkRules(string(out), network)
	var done []string
	var errs []error
	for _, r := range rules {
		if _, err := run(cmd, append([]string{"-t", table, "-D"}, r...)...); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, fmt.Sprintf("%s -t %s: rule %s", cmd, table, strings.Join(r, " ")))
	}
	for _, c := range chains {
		if _, err := run(cmd, "-t", table, "-F", c); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := run(cmd, "-t", table, "-X", c); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, fmt.Sprintf("%s -t %s: chain %s", cmd, table, c))
	}
	return done, errors.Join(errs...)
}

// networkRules reads one table of iptables-save output and returns the rules (as arguments after
// -A, chain first) whose comment names network, except those inside chains that go themselves,
// and the per-pod chains to remove: those such rules jump to.
func networkRules(save, network string) (rules [][]string, chains []string) {
	mark := `name: "` + network + `"`
	gone := map[string]bool{}
	var all [][]string
	for _, line := range strings.Split(save, "\n") {
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		args := splitRule(strings.TrimPrefix(line, "-A "))
		if len(args) == 0 || !ruleComment(args, mark) {
			continue
		}
		all = append(all, args)
		// The per-pod chains: those such a rule jumps to, and those holding such rules (a chain
		// whose jump is already gone).
		for _, c := range []string{ruleTarget(args), args[0]} {
			if strings.HasPrefix(c, "CNI-") && !strings.HasPrefix(c, "CNI-HOSTPORT-") && !gone[c] {
				gone[c] = true
				chains = append(chains, c)
			}
		}
	}
	for _, r := range all {
		if !gone[r[0]] { // a rule inside a chain that is flushed needs no delete of its own
			rules = append(rules, r)
		}
	}
	return rules, chains
}

func ruleComment(args []string, mark string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--comment" && strings.Contains(args[i+1], mark) {
			return true
		}
	}
	return false
}

func ruleTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" {
			return args[i+1]
		}
	}
	return ""
}

// splitRule splits a rule of iptables-save output into arguments: a double-quoted argument may hold
// spaces and \" or \\ escapes, as iptables-save writes comments.
func splitRule(s string) []string {
	var out []string
	var cur strings.Builder
	in, quoted, esc := false, false, false
	for _, r := range s {
		switch {
		case esc:
			cur.WriteRune(r)
			esc = false
		case quoted && r == '\\':
			esc = true
		case r == '"':
			quoted = !quoted
			in = true
		case r == ' ' && !quoted:
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// linkKind is the kind (IFLA_INFO_KIND: "bridge", "veth", ...) of the link with index, "" for a
// device without one (a physical NIC, lo).
func linkKind(index int) (string, error) {
	rib, err := syscall.NetlinkRIB(unix.RTM_GETLINK, unix.AF_UNSPEC)
	if err != nil {
		return "", fmt.Errorf("list links: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return "", fmt.Errorf("list links: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg {
			continue
		}
		if int(int32(hostEndian.Uint32(m.Data[4:8]))) != index {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return "", fmt.Errorf("link %d: %w", index, err)
		}
		for _, a := range attrs {
			if a.Attr.Type != unix.IFLA_LINKINFO {
				continue
			}
			for b := a.Value; len(b) >= unix.SizeofRtAttr; {
				l := int(hostEndian.Uint16(b[0:2]))
				if l < unix.SizeofRtAttr || l > len(b) {
					break
				}
				if hostEndian.Uint16(b[2:4]) == unix.IFLA_INFO_KIND {
					return strings.TrimRight(string(b[unix.SizeofRtAttr:l]), "\x00"), nil
				}
				b = b[min((l+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(b)):]
			}
			return "", nil
		}
		return "", nil
	}
	return "", fmt.Errorf("no link with index %d", index)
}
