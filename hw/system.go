package hw

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// System is the software identity of the machine, what kubelet puts in a Node's nodeInfo. Each
// field is empty when its file is absent.
type System struct {
	// OSImage is PRETTY_NAME of os-release, e.g. "Debian GNU/Linux 12 (bookworm)".
	OSImage string
	// KernelVersion is the kernel release, as `uname -r` prints it.
	KernelVersion string
	// BootID changes on every boot; MachineID is the installation's (systemd's machine-id).
	BootID, MachineID string
	// SystemUUID is the hardware's UUID (see SystemUUID).
	SystemUUID string
	// Arch is the architecture mqlet was built for, in Go's (and Kubernetes') spelling: arm64,
	// arm, amd64. Machine is the kernel's (`uname -m`: aarch64, armv7l, x86_64), which differs
	// from Arch for a 32-bit build on a 64-bit kernel; empty on kernels before 6.1, which lack
	// /proc/sys/kernel/arch.
	Arch, Machine string
}

// ReadSystem reads the System facts under root.
func ReadSystem(root string) System {
	return System{
		OSImage:       OSImage(root),
		KernelVersion: KernelVersion(root),
		BootID:        BootID(root),
		MachineID:     MachineID(root),
		SystemUUID:    SystemUUID(root),
		Arch:          runtime.GOARCH,
		Machine:       Machine(root),
	}
}

// OSImage is PRETTY_NAME from root/etc/os-release, else from root/usr/lib/os-release (the file
// /etc/os-release links to, and the one to read when /etc has none), as kubelet reports it.
func OSImage(root string) string {
	for _, rel := range []string{"etc/os-release", "usr/lib/os-release"} {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
				return unquote(v)
			}
		}
	}
	return ""
}

// unquote undoes os-release's shell-style quoting of one value.
func unquote(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		v = v[1 : len(v)-1]
		if strings.Contains(v, `\`) {
			v = strings.NewReplacer(`\"`, `"`, `\\`, `\`, "\\`", "`", `\$`, `$`).Replace(v)
		}
	}
	return v
}

// KernelVersion is root/proc/sys/kernel/osrelease (`uname -r`).
func KernelVersion(root string) string {
	v, _ := readValue(root, "proc/sys/kernel/osrelease")
	return v
}

// BootID is root/proc/sys/kernel/random/boot_id.
func BootID(root string) string {
	v, _ := readValue(root, "proc/sys/kernel/random/boot_id")
	return v
}

// MachineID is root/etc/machine-id, else D-Bus's copy in root/var/lib/dbus/machine-id (systems
// without systemd).
func MachineID(root string) string {
	v, _ := firstValue(root, "etc/machine-id", "var/lib/dbus/machine-id")
	return v
}

// Machine is the kernel's machine name (`uname -m`) from root/proc/sys/kernel/arch (Linux 6.1+).
func Machine(root string) string {
	v, _ := readValue(root, "proc/sys/kernel/arch")
	return v
}

// SystemUUID is the machine's hardware UUID as kubelet reports it in nodeInfo.systemUUID: the
// firmware's (SMBIOS) root/sys/class/dmi/id/product_uuid, readable by root only. Boards without
// DMI firmware (a Raspberry Pi) have none: the installation's machine-id then stands in, written
// as a UUID (systemd's `systemd-id128 show --uuid` form), so the node still has a stable id.
// Empty when neither can be read.
func SystemUUID(root string) string {
	if v, ok := readValue(root, "sys/class/dmi/id/product_uuid"); ok {
		return v
	}
	id := MachineID(root)
	if len(id) != 32 {
		return ""
	}
	for _, c := range id {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return ""
		}
	}
	id = strings.ToLower(id)
	return id[0:8] + "-" + id[8:12] + "-" + id[12:16] + "-" + id[16:20] + "-" + id[20:32]
}
