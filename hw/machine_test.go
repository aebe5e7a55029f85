package hw

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// The fixture trees under testdata/ mirror the files of three machines (see each test's want):
// rpi4 a Raspberry Pi 4 Model B on Raspberry Pi OS bookworm (arm64), device tree under
// /proc/device-tree, firmware get_throttled 0x50005 (under-voltage and throttled now and since
// boot); rpi5 a Raspberry Pi 5 whose device tree is read through /sys and has no serial-number,
// os-release and machine-id only in their fallback places, and the rpi_volt alarm raised; x86 a
// Dell server on Ubuntu 22.04 with DMI, no device tree, a 5.15 kernel without
// /proc/sys/kernel/arch, and two thermal zones.
var trees = []string{"rpi4", "rpi5", "x86"}

func tree(name string) string { return filepath.Join("testdata", name) }

func TestCPUOnFixtures(t *testing.T) {
	want := map[string]CPUInfo{
		"rpi4": {Count: 4, Model: "ARM Cortex-A72", Hardware: "BCM2835", Revision: "c03114",
			Serial: "100000003a1c2b4d", BoardModel: "Raspberry Pi 4 Model B Rev 1.4"},
		"rpi5": {Count: 4, Model: "ARM Cortex-A76", Revision: "d04170", Serial: "5a2e8c41f07b93d6",
			BoardModel: "Raspberry Pi 5 Model B Rev 1.0"},
		"x86": {Count: 2, Model: "Intel(R) Xeon(R) Silver 4114 CPU @ 2.20GHz"},
	}
	for _, name := range trees {
		got, err := CPU(tree(name))
		if err != nil || got != want[name] {
			t.Errorf("%s: CPU = %+v, %v\nwant %+v", name, got, err, want[name])
		}
	}
	if _, err := CPU(t.TempDir()); err == nil {
		t.Errorf("CPU of a root without proc/cpuinfo: no error")
	}
}

func TestCPUArmv7ModelName(t *testing.T) {
	// A 32-bit kernel prints a model name per processor; it wins over the part table.
	root := t.TempDir()
	write(t, root, "proc/cpuinfo", "processor\t: 0\nmodel name\t: ARMv7 Processor rev 4 (v7l)\nCPU implementer\t: 0x41\nCPU part\t: 0xd03\n\n"+
		"processor\t: 1\nmodel name\t: ARMv7 Processor rev 4 (v7l)\n\nHardware\t: BCM2835\nRevision\t: a02082\n")
	got, err := CPU(root)
	want := CPUInfo{Count: 2, Model: "ARMv7 Processor rev 4 (v7l)", Hardware: "BCM2835", Revision: "a02082"}
	if err != nil || got != want {
		t.Errorf("CPU = %+v, %v; want %+v", got, err, want)
	}
}

func TestMemTotalOnFixtures(t *testing.T) {
	want := map[string]int64{"rpi4": 3882236 << 10, "rpi5": 8245616 << 10, "x86": 32780412 << 10}
	for _, name := range trees {
		if got, err := MemTotal(tree(name)); err != nil || got != want[name] {
			t.Errorf("%s: MemTotal = %d, %v; want %d", name, got, err, want[name])
		}
	}
}

func TestReadSystemOnFixtures(t *testing.T) {
	want := map[string]System{
		"rpi4": {OSImage: "Debian GNU/Linux 12 (bookworm)", KernelVersion: "6.6.51+rpt-rpi-v8",
			BootID: "5f0c1a7e-3b9d-4c2e-8a61-0d4e9b7f2c13", MachineID: "3c9b2f7d41e84a0f9d6a5e1b2c8f7a04", Machine: "aarch64",
			SystemUUID: "3c9b2f7d-41e8-4a0f-9d6a-5e1b2c8f7a04"}, // no DMI: the machine-id as a UUID
		// os-release only in /usr/lib, machine-id only in D-Bus's place.
		"rpi5": {OSImage: "Debian GNU/Linux 12 (bookworm)", KernelVersion: "6.6.51+rpt-rpi-2712",
			BootID: "a81e62d4-0f5b-47c3-9e28-6b1d3f40c7e9", MachineID: "e7d14a2b9c0f4f6d8b3a51c6e2f09d87", Machine: "aarch64",
			SystemUUID: "e7d14a2b-9c0f-4f6d-8b3a-51c6e2f09d87"},
		// A 5.15 kernel has no /proc/sys/kernel/arch.
		"x86": {OSImage: "Ubuntu 22.04.4 LTS", KernelVersion: "5.15.0-105-generic",
			BootID: "0d9f1c3e-7a24-4b8e-b5c6-91e2a7d30f58", MachineID: "8a1f0c5d2e7b4936a4c8d0e1f2b3a697",
			SystemUUID: "4c4c4544-0051-5810-804b-b4c04f324d33"}, // DMI's product_uuid
	}
	for _, name := range trees {
		w := want[name]
		w.Arch = runtime.GOARCH
		if got := ReadSystem(tree(name)); got != w {
			t.Errorf("%s: ReadSystem =\n %+v\nwant\n %+v", name, got, w)
		}
	}
	// Nothing there: every field but the build's architecture is empty, and nothing fails.
	if got := ReadSystem(t.TempDir()); got != (System{Arch: runtime.GOARCH}) {
		t.Errorf("ReadSystem of an empty root = %+v", got)
	}
}

// Huge page pools: size in bytes -> pages, from the x86 fixture's 2 MiB pool of 64 pages and its
// empty 1 GiB pool; the Raspberry Pi fixtures have none (no error: a kernel without hugetlbfs).
func TestHugePagesOnFixtures(t *testing.T) {
	got, err := HugePages(tree("x86"))
	if want := map[int64]int64{2 << 20: 64, 1 << 30: 0}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("x86: HugePages = %v, %v; want %v", got, err, want)
	}
	if got, err := HugePages(tree("rpi4")); err != nil || len(got) != 0 {
		t.Errorf("rpi4: HugePages = %v, %v; want none", got, err)
	}
	root := t.TempDir()
	dir := filepath.Join(root, "sys/kernel/mm/hugepages/hugepages-2048kB")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nr_hugepages"), []byte("many\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := HugePages(root); err == nil || !strings.Contains(err.Error(), "hugepages-2048kB") {
		t.Errorf("a pool with a bad count: err %v, want one naming the pool", err)
	}
}

func TestOSImageQuoting(t *testing.T) {
	for content, want := range map[string]string{
		"NAME=x\nPRETTY_NAME='Alpine Linux v3.20'\n":   "Alpine Linux v3.20",
		"PRETTY_NAME=Buildroot\n":                      "Buildroot",
		`PRETTY_NAME="Yocto \"kirkstone\" 4.0"` + "\n": `Yocto "kirkstone" 4.0`,
		"ID=debian\n": "",
		"  PRETTY_NAME=\"Fedora Linux 40 (Server Edition)\"\n": "Fedora Linux 40 (Server Edition)",
	} {
		root := t.TempDir()
		write(t, root, "etc/os-release", content)
		if got := OSImage(root); got != want {
			t.Errorf("OSImage of %q = %q, want %q", content, got, want)
		}
	}
}

func TestReadBoardOnFixtures(t *testing.T) {
	want := map[string]Board{
		"rpi4": {Model: "Raspberry Pi 4 Model B Rev 1.4", Serial: "100000003a1c2b4d"},
		// No serial-number in its device tree: the serial comes from /proc/cpuinfo.
		"rpi5": {Model: "Raspberry Pi 5 Model B Rev 1.0", Serial: "5a2e8c41f07b93d6"},
		"x86":  {Model: "Dell Inc. PowerEdge R640", Serial: "4QXK2M3"},
	}
	for _, name := range trees {
		cpu, err := CPU(tree(name))
		if err != nil {
			t.Fatal(err)
		}
		if got := ReadBoard(tree(name), cpu); got != want[name] {
			t.Errorf("%s: ReadBoard = %+v, want %+v", name, got, want[name])
		}
	}
	if got := ReadBoard(t.TempDir(), CPUInfo{}); got != (Board{}) {
		t.Errorf("ReadBoard of an empty root = %+v, want nothing", got)
	}
}

func TestReadBoardSkipsPlaceholders(t *testing.T) {
	root := t.TempDir()
	write(t, root, "sys/class/dmi/id/sys_vendor", "Default string\n")
	write(t, root, "sys/class/dmi/id/product_name", "ZBOX-CI329\n")
	write(t, root, "sys/class/dmi/id/product_serial", "To be filled by O.E.M.\n")
	// A Pi Zero 2 prints an all-zero serial.
	if got := ReadBoard(root, CPUInfo{Serial: "0000000000000000"}); got != (Board{Model: "ZBOX-CI329"}) {
		t.Errorf("ReadBoard = %+v, want the product name alone and no serial", got)
	}
	for _, v := range []string{"To be filled by O.E.M.", "System Serial Number", "0", "00000000", "0x00000000", "Not Specified", " none "} {
		if !placeholder(v) {
			t.Errorf("placeholder(%q) = false", v)
		}
	}
	for _, v := range []string{"4QXK2M3", "100000003a1c2b4d", "10000000"} {
		if placeholder(v) {
			t.Errorf("placeholder(%q) = true", v)
		}
	}
}

func TestTemperaturesOnFixtures(t *testing.T) {
	want := map[string][]Temperature{
		"rpi4": {{Zone: "thermal_zone0", Type: "cpu-thermal", Celsius: 47.712}},
		"rpi5": {{Zone: "thermal_zone0", Type: "cpu-thermal", Celsius: 53.75}},
		"x86":  {{Zone: "thermal_zone0", Type: "acpitz", Celsius: 27.8}, {Zone: "thermal_zone1", Type: "x86_pkg_temp", Celsius: 45}},
	}
	for _, name := range trees {
		if got := Temperatures(tree(name)); !reflect.DeepEqual(got, want[name]) {
			t.Errorf("%s: Temperatures = %+v, want %+v", name, got, want[name])
		}
	}
	if got := Temperatures(t.TempDir()); len(got) != 0 {
		t.Errorf("Temperatures of a root without thermal zones = %+v", got)
	}
}

func TestTemperaturesZoneOrderAndBadZones(t *testing.T) {
	root := t.TempDir()
	write(t, root, "sys/class/thermal/thermal_zone10/temp", "30000\n")
	write(t, root, "sys/class/thermal/thermal_zone2/temp", "-5500\n") // no type file
	write(t, root, "sys/class/thermal/thermal_zone3/type", "battery\n")
	write(t, root, "sys/class/thermal/thermal_zone3/temp", "") // a sensor that cannot be read now
	write(t, root, "sys/class/thermal/thermal_zone4/temp", "hot\n")
	want := []Temperature{{Zone: "thermal_zone2", Type: "thermal_zone2", Celsius: -5.5}, {Zone: "thermal_zone10", Type: "thermal_zone10", Celsius: 30}}
	if got := Temperatures(root); !reflect.DeepEqual(got, want) {
		t.Errorf("Temperatures = %+v, want %+v", got, want)
	}
}

func TestThrottledOnFixtures(t *testing.T) {
	// rpi4: get_throttled 0x50005.
	got, ok, err := Throttled(tree("rpi4"))
	want := Throttling{UnderVoltage: true, Throttled: true, UnderVoltageOccurred: true, ThrottledOccurred: true, Source: "get_throttled"}
	if err != nil || !ok || got != want {
		t.Errorf("rpi4: Throttled = %+v, %v, %v; want %+v", got, ok, err, want)
	}
	if a, o := got.Active(), got.Occurred(); !reflect.DeepEqual(a, []string{"under-voltage", "throttled"}) || !reflect.DeepEqual(o, a) {
		t.Errorf("rpi4: Active %q, Occurred %q", a, o)
	}
	// rpi5: no get_throttled; the rpi_volt alarm is raised (hwmon2, among other hwmon devices).
	got, ok, err = Throttled(tree("rpi5"))
	if err != nil || !ok || got != (Throttling{UnderVoltage: true, Source: "rpi_volt"}) {
		t.Errorf("rpi5: Throttled = %+v, %v, %v; want the rpi_volt under-voltage alarm", got, ok, err)
	}
	// x86: neither.
	if got, ok, err := Throttled(tree("x86")); ok || err != nil || got != (Throttling{}) {
		t.Errorf("x86: Throttled = %+v, %v, %v; want none", got, ok, err)
	}
}

func TestThrottledFormsAndErrors(t *testing.T) {
	for raw, want := range map[string]Throttling{
		"0\n":        {Source: "get_throttled"},
		"0x80008\n":  {SoftTempLimit: true, SoftTempOccurred: true, Source: "get_throttled"},
		"e000e\n":    {FreqCapped: true, Throttled: true, SoftTempLimit: true, FreqCappedOccurred: true, ThrottledOccurred: true, SoftTempOccurred: true, Source: "get_throttled"},
		"20000\n":    {FreqCappedOccurred: true, Source: "get_throttled"},
		"0x00010000": {UnderVoltageOccurred: true, Source: "get_throttled"},
	} {
		root := t.TempDir()
		write(t, root, "sys/devices/platform/soc/soc:firmware/get_throttled", raw)
		if got, ok, err := Throttled(root); err != nil || !ok || got != want {
			t.Errorf("get_throttled %q: %+v, %v, %v; want %+v", raw, got, ok, err, want)
		}
	}
	// The rpi_volt alarm adds under-voltage now to a word that was read before it rose.
	root := t.TempDir()
	write(t, root, "sys/devices/platform/soc/soc:firmware/get_throttled", "10000\n")
	write(t, root, "sys/class/hwmon/hwmon4/name", "rpi_volt\n")
	write(t, root, "sys/class/hwmon/hwmon4/in0_lcrit_alarm", "1\n")
	if got, _, _ := Throttled(root); !got.UnderVoltage || !got.UnderVoltageOccurred || got.Source != "get_throttled" {
		t.Errorf("get_throttled with the rpi_volt alarm up: %+v", got)
	}
	// A Pi 5 style firmware node is found too.
	root = t.TempDir()
	write(t, root, "sys/devices/platform/soc@107c000000/soc@107c000000:firmware/get_throttled", "4\n")
	if got, ok, _ := Throttled(root); !ok || !got.Throttled {
		t.Errorf("firmware node on the Pi 5 bus: %+v, %v", got, ok)
	}
	// Garbage names the file.
	root = t.TempDir()
	write(t, root, "sys/devices/platform/soc/soc:firmware/get_throttled", "throttled=0x0\n")
	if _, _, err := Throttled(root); err == nil || !strings.Contains(err.Error(), "get_throttled") {
		t.Errorf("malformed get_throttled: err = %v, want one naming the file", err)
	}
}

func TestHostIPOnFixtures(t *testing.T) {
	ifaces := func(list ...Interface) Interfaces {
		return func() ([]Interface, error) { return list, nil }
	}
	up := net.FlagUp | net.FlagBroadcast
	lo := Interface{Name: "lo", Flags: net.FlagUp | net.FlagLoopback, Addrs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}}
	// rpi4's default route is on eth0; wlan0 (listed first) is up too.
	got := HostIPOf(tree("rpi4"), ifaces(lo,
		Interface{Name: "wlan0", Flags: up, Addrs: []net.IP{net.ParseIP("192.168.1.57")}},
		Interface{Name: "eth0", Flags: up, Addrs: []net.IP{net.ParseIP("fe80::dea6:32ff:fe01:2345"), net.ParseIP("192.168.1.23")}}))
	if got != "192.168.1.23" {
		t.Errorf("rpi4: HostIPOf = %q, want eth0's 192.168.1.23", got)
	}
	// rpi5 routes by wlan0.
	if got := HostIPOf(tree("rpi5"), ifaces(lo, Interface{Name: "eth0", Flags: up, Addrs: []net.IP{net.ParseIP("10.0.9.4")}},
		Interface{Name: "wlan0", Flags: up, Addrs: []net.IP{net.ParseIP("10.0.0.12")}})); got != "10.0.0.12" {
		t.Errorf("rpi5: HostIPOf = %q, want wlan0's 10.0.0.12", got)
	}
	// x86: the default route's interface has no IPv4 address (yet): the first up interface that has one.
	if got := HostIPOf(tree("x86"), ifaces(lo, Interface{Name: "eno1", Flags: up},
		Interface{Name: "eno2", Flags: 0, Addrs: []net.IP{net.ParseIP("172.16.5.9")}},
		Interface{Name: "docker0", Flags: up, Addrs: []net.IP{net.ParseIP("172.17.0.1")}})); got != "172.17.0.1" {
		t.Errorf("x86 without eno1's address: HostIPOf = %q, want docker0's 172.17.0.1 (eno2 is down)", got)
	}
	// Offline, no route table, only loopback: no address.
	if got := HostIPOf(t.TempDir(), ifaces(lo)); got != "" {
		t.Errorf("HostIPOf with loopback only = %q", got)
	}
	if got := HostIPOf(tree("rpi4"), func() ([]Interface, error) { return nil, os.ErrPermission }); got != "" {
		t.Errorf("HostIPOf when interfaces cannot be listed = %q", got)
	}
	if ip := HostIP(); ip != "" && net.ParseIP(ip).To4() == nil {
		t.Errorf("HostIP on this machine = %q, not an IPv4 address", ip)
	}
}

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	path := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
