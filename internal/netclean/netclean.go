// Package netclean removes what a CNI bridge network leaves on the host when its pods were never
// given a DEL (a killed test or benchmark run, or a simulated reboot): its bridge device, the
// iptables rules that name the network (the bridge plugin's masquerading, portmap's DNAT) and the
// per-pod chains those rules jump to. Tests and the benchmark harness use it; mqlet itself never
// does (it runs DEL).
package netclean

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// Network removes the bridge and the network's rules and per-pod chains. Shared chains
// (portmap's CNI-HOSTPORT-*) stay: other networks may use them.
func Network(bridge, name string) error {
	exec.Command("ip", "link", "delete", bridge).Run() // absent is fine
	var errs []error
	var chains []string
	for _, table := range []string{"nat", "filter"} {
		rules, err := Rules(table, name)
		if err != nil {
			return err
		}
		for _, rule := range rules {
			args := SplitRule(strings.TrimPrefix(rule, "-A "))
			if i := slices.Index(args, "-j"); i >= 0 && i+1 < len(args) && strings.HasPrefix(args[i+1], "CNI-") &&
				!strings.HasPrefix(args[i+1], "CNI-HOSTPORT-") {
				chains = append(chains, table+" "+args[i+1])
			}
			if out, err := exec.Command("iptables", append([]string{"-w", "-t", table, "-D"}, args...)...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("iptables -t %s -D %s: %v: %s", table, strings.Join(args, " "), err, out))
			}
		}
	}
	for _, c := range chains {
		table, chain, _ := strings.Cut(c, " ")
		exec.Command("iptables", "-w", "-t", table, "-F", chain).Run()
		exec.Command("iptables", "-w", "-t", table, "-X", chain).Run()
	}
	return errors.Join(errs...)
}

// Rules returns the rules of table (as `iptables -S` prints them, "-A ..." only) that name the
// network.
func Rules(table, name string) ([]string, error) {
	b, err := exec.Command("iptables", "-w", "-t", table, "-S").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("iptables -t %s -S: %v: %s", table, err, b)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "-A ") && strings.Contains(l, `\"`+name+`\"`) {
			out = append(out, l)
		}
	}
	return out, nil
}

// SplitRule splits an `iptables -S` rule into arguments, keeping quoted comments whole.
func SplitRule(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, escaped := false, false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\':
			escaped = true
		case r == '"':
			quoted = !quoted
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}
