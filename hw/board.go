package hw

import (
	"strings"
)

// Board identifies the physical machine: its model and serial number, where it has them.
type Board struct {
	// Model is the device tree's model ("Raspberry Pi 4 Model B Rev 1.4"), else DMI's vendor and
	// product name ("Dell Inc. PowerEdge R640"); empty when neither is there (a VM may have DMI
	// placeholders only).
	Model string
	// Serial is the device tree's serial-number, else /proc/cpuinfo's "Serial" (older Raspberry
	// Pi kernels), else DMI's product_serial (readable by root only); placeholders such as
	// "To be filled by O.E.M." and all-zero serials count as none.
	Serial string
}

// Device-tree and DMI files. /proc/device-tree links to /sys/firmware/devicetree/base, but either
// may be missing in a container or a chroot, so both are tried.
var (
	dtModel  = []string{"proc/device-tree/model", "sys/firmware/devicetree/base/model"}
	dtSerial = []string{"proc/device-tree/serial-number", "sys/firmware/devicetree/base/serial-number"}
)

const dmiDir = "sys/class/dmi/id/"

// ReadBoard reads the Board facts under root. cpu is /proc/cpuinfo as CPU read it (for the serial
// of boards whose device tree has none); a zero CPUInfo is fine.
func ReadBoard(root string, cpu CPUInfo) Board {
	var b Board
	if m, ok := firstValue(root, dtModel...); ok {
		b.Model = m
	} else {
		var parts []string
		for _, f := range []string{"sys_vendor", "product_name"} {
			if v, ok := readValue(root, dmiDir+f); ok && !placeholder(v) {
				parts = append(parts, v)
			}
		}
		b.Model = strings.Join(parts, " ")
	}
	candidates := []func() string{
		func() string { v, _ := firstValue(root, dtSerial...); return v },
		func() string { return cpu.Serial },
		func() string { v, _ := readValue(root, dmiDir+"product_serial"); return v },
	}
	for _, c := range candidates {
		if s := c(); s != "" && !placeholder(s) {
			b.Serial = s
			break
		}
	}
	return b
}

// placeholders are what firmware vendors leave in DMI fields they did not fill in, lowercased.
var placeholders = map[string]bool{
	"to be filled by o.e.m.": true, "to be filled by oem": true, "default string": true,
	"system serial number": true, "system product name": true, "system manufacturer": true,
	"not specified": true, "not applicable": true, "none": true, "n/a": true, "oem": true,
	"o.e.m.": true, "unknown": true, "0123456789": true, "123456789": true, "chassis serial number": true,
}

// placeholder reports whether v says nothing: a known filler text, or only zeros (a Raspberry Pi
// Zero 2's serial, some boards' DMI), possibly with separators.
func placeholder(v string) bool {
	if placeholders[strings.ToLower(strings.TrimSpace(v))] {
		return true
	}
	zeros := strings.Map(func(r rune) rune {
		switch r {
		case '0', ' ', '-', ':', '.':
			return -1
		}
		return r
	}, v)
	return zeros == "" || strings.EqualFold(zeros, "x") // "0x00000000"
}
