package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// required are the controllers pod cgroups cannot do without: cpu (shares or weight, CFS quota),
// memory (limits, OOM kills) and pids. Without one, runc fails every pod that sets a limit, or
// worse, the limit is silently not applied.
var required = []string{"cpu", "memory", "pids"}

// optional controllers are enabled for pods where the host has them (cpuset for CPU pinning by
// runc, io for I/O weights on v2); a host without them still runs pods.
var optional = []string{"cpuset", "io"}

// ControllerError says which controllers pods need are missing and how to get them.
type ControllerError struct {
	Mode    Mode
	Missing []string
	Detail  string
}

func (e *ControllerError) Error() string {
	return fmt.Sprintf("cgroup %s: mqlet needs the %s controllers to run pods; missing: %s. %s",
		e.Mode, strings.Join(required, ", "), strings.Join(e.Missing, ", "), e.Detail)
}

// Check verifies that the controllers pods need are there, so the agent can refuse to start with
// a clear message rather than have runc fail every pod. On v1 (legacy or hybrid) each must have a
// mounted hierarchy. On v2 each must be in the root's cgroup.controllers and delegated down to
// cgroupRoot: the cgroup.subtree_control of every ancestor must enable it. Ancestors mqlet owns
// (the hierarchy's root, and levels that do not exist yet and that mqlet makes) get it enabled
// here; an existing intermediate cgroup belongs to someone else (systemd's slices), and one that
// does not delegate a controller is reported, naming the cgroup.
func (l Layout) Check(cgroupRoot string) error {
	switch l.Mode {
	case Legacy, Hybrid:
		return l.checkV1()
	case Unified:
		_, err := l.delegateV2(cgroupRoot, "")
		return err
	}
	return &ControllerError{Mode: l.Mode, Missing: slices.Clone(required),
		Detail: "No cgroup file system is mounted (neither cgroup nor cgroup2 in mountinfo): mount cgroup2 at /sys/fs/cgroup (systemd does at boot)."}
}

func (l Layout) checkV1() error {
	var missing, details []string
	for _, c := range required {
		if _, err := l.v1Root(c); err != nil {
			if _, mounted := l.V1[c]; mounted {
				// Mounted, but not where the cgroup library looks for it.
				return fmt.Errorf("cgroup %s: %w", l.Mode, err)
			}
			missing = append(missing, c)
			details = append(details, l.diagnose(c))
		}
	}
	if len(missing) > 0 {
		return &ControllerError{Mode: l.Mode, Missing: missing, Detail: strings.Join(details, " ")}
	}
	return nil
}

// v2Controllers reads the controllers a cgroup v2 directory offers its children (cgroup.controllers)
// or enables for them (cgroup.subtree_control).
func v2Controllers(dir, file string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// delegateV2 checks the v2 controllers and enables them down to cgroupRoot's parent. It returns
// the controllers mqlet enables for its own levels: the required ones plus the optional ones the
// host has.
func (l Layout) delegateV2(cgroupRoot, delegatedRoot string) ([]string, error) {
	avail, err := v2Controllers(l.Unified, "cgroup.controllers")
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: read the root's controllers: %w", l.Mode, err)
	}
	var missing, details []string
	for _, c := range required {
		if !slices.Contains(avail, c) {
			missing = append(missing, c)
			details = append(details, l.diagnose(c))
		}
	}
	if len(missing) > 0 {
		return nil, &ControllerError{Mode: l.Mode, Missing: missing,
			Detail: fmt.Sprintf("%s has: %s. %s", filepath.Join(l.Unified, "cgroup.controllers"), strings.Join(avail, " "), strings.Join(details, " "))}
	}
	want := slices.Clone(required)
	for _, c := range optional {
		if slices.Contains(avail, c) {
			want = append(want, c)
		}
	}
	// Walk down to cgroupRoot: each level must enable the controllers for the next one. The
	// hierarchy's root and the levels made here are mqlet's to change; a level that existed before
	// belongs to whoever made it.
	dir, owned := l.Unified, true
	rel := "/"
	for _, elem := range splitPath(cgroupRoot) {
		if delegatedRoot != "" && rel == delegatedRoot {
			owned = true // what was delegated to mqlet is its to change, though it existed
		}
		if owned {
			if err := enableV2(dir, want); err != nil {
				return nil, fmt.Errorf("cgroup %s: %w", l.Mode, err)
			}
		} else if err := delegated(dir, want); err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", l.Mode, err)
		}
		dir, rel = filepath.Join(dir, elem), path.Join(rel, elem)
		switch err := os.Mkdir(dir, 0o755); {
		case err == nil:
			owned = true
		case errors.Is(err, os.ErrExist):
			owned = false
		default:
			return nil, fmt.Errorf("cgroup %s: make %s: %w", l.Mode, dir, err)
		}
	}
	return want, nil
}

// delegated checks that an existing cgroup mqlet does not own enables the required controllers
// for its children.
func delegated(dir string, want []string) error {
	on, err := v2Controllers(dir, "cgroup.subtree_control")
	if err != nil {
		return fmt.Errorf("read %s: %w", filepath.Join(dir, "cgroup.subtree_control"), err)
	}
	var lack []string
	for _, c := range required {
		if slices.Contains(want, c) && !slices.Contains(on, c) {
			lack = append(lack, c)
		}
	}
	if len(lack) == 0 {
		return nil
	}
	return fmt.Errorf("the %s controller%s not delegated to the cgroups below %s (its cgroup.subtree_control has %q), and mqlet does not own that cgroup: give mqlet a delegated subtree (systemd: Delegate=yes in mqlet's unit) or set cgroupRoot to a cgroup directly below the root",
		strings.Join(lack, ", "), plural(len(lack), " is", "s are"), dir, strings.Join(on, " "))
}

// enableV2 turns on the controllers in dir's cgroup.subtree_control that are not on yet, of those
// dir has (an optional one its parent does not pass down is skipped). The kernel refuses (EBUSY)
// when dir holds processes itself, except at the root.
func enableV2(dir string, want []string) error {
	file := filepath.Join(dir, "cgroup.subtree_control")
	on, err := v2Controllers(dir, "cgroup.subtree_control")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", file, err)
	}
	has, herr := v2Controllers(dir, "cgroup.controllers")
	var add []string
	for _, c := range want {
		if herr == nil && !slices.Contains(has, c) && !slices.Contains(required, c) {
			continue
		}
		if !slices.Contains(on, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := os.WriteFile(file, []byte(strings.Join(add, " ")), 0o644); err != nil {
		return fmt.Errorf("enable %s in %s: %w", strings.Join(add, " "), file, err)
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// splitPath turns "/mqlet/ns" into ["mqlet", "ns"].
func splitPath(p string) []string {
	p = strings.Trim(filepath.Clean("/"+p), "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// kernelOption names the config option a kernel needs for a controller.
var kernelOption = map[string]string{
	"cpu":    "CONFIG_CGROUP_SCHED and CONFIG_FAIR_GROUP_SCHED",
	"memory": "CONFIG_MEMCG",
	"pids":   "CONFIG_CGROUP_PIDS",
}

// diagnose explains, from /proc/cgroups and /proc/cmdline under the layout's root, why controller c
// is missing and what enables it.
func (l Layout) diagnose(c string) string {
	all, err := readProcCgroups(filepath.Join(l.Root, "proc", "cgroups"))
	st, listed := all[c]
	cmdline, _ := os.ReadFile(filepath.Join(l.Root, "proc", "cmdline"))
	args := strings.Fields(string(cmdline))
	switch {
	case err != nil:
		return fmt.Sprintf("%s: /proc/cgroups is unreadable, so the cause is unknown; if the kernel disables it at boot, add cgroup_enable=%s to the kernel command line.", c, c)
	case !listed:
		return fmt.Sprintf("%s: this kernel was built without it (/proc/cgroups does not list it): use a kernel with %s.", c, kernelOption[c])
	case !st.enabled:
		msg := fmt.Sprintf("%s: the kernel disabled it at boot (/proc/cgroups: enabled 0", c)
		if slices.Contains(args, "cgroup_disable="+c) {
			msg += "; the kernel command line has cgroup_disable=" + c
		}
		msg += fmt.Sprintf("): add cgroup_enable=%s at the end of the kernel command line (a later option wins) and reboot.", c)
		if c == "memory" {
			msg += " On a Raspberry Pi, whose firmware adds cgroup_disable=memory, append ' cgroup_enable=memory cgroup_memory=1' to the single line of /boot/firmware/cmdline.txt (/boot/cmdline.txt before Bookworm)."
		}
		return msg
	case l.Mode == Unified && st.hierarchy != 0:
		return fmt.Sprintf("%s: it is attached to a cgroup v1 hierarchy (id %d in /proc/cgroups), so cgroup v2 cannot use it: unmount that hierarchy, or boot with systemd.unified_cgroup_hierarchy=1 and without cgroup_no_v1 exceptions.", c, st.hierarchy)
	case l.Mode != Unified && st.hierarchy == 0 && l.Unified != "":
		return fmt.Sprintf("%s: it is attached to the cgroup v2 hierarchy at %s while the other controllers are in v1 hierarchies (a cgroup_no_v1=%s option?); mqlet and runc need one mode: boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2, or without cgroup_no_v1 for v1.", c, l.Unified, c)
	case l.Mode != Unified:
		return fmt.Sprintf("%s: the kernel has it but no hierarchy is mounted: mount it (mount -t cgroup -o %s cgroup /sys/fs/cgroup/%s) or boot with systemd.unified_cgroup_hierarchy=1 to use cgroup v2.", c, c, c)
	}
	return fmt.Sprintf("%s: the kernel has it but the root cgroup does not offer it.", c)
}

type procCgroup struct {
	hierarchy int
	enabled   bool
}

// readProcCgroups parses /proc/cgroups: "#subsys_name hierarchy num_cgroups enabled".
func readProcCgroups(path string) (map[string]procCgroup, error) {
	out := map[string]procCgroup{}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 4 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		h, _ := strconv.Atoi(fields[1])
		out[fields[0]] = procCgroup{hierarchy: h, enabled: fields[3] == "1"}
	}
	return out, s.Err()
}
