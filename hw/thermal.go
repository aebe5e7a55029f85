package hw

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Temperature is one thermal zone's reading.
type Temperature struct {
	Zone string // the sysfs name, e.g. thermal_zone0
	// Type is what the zone measures, as the driver names it: cpu-thermal (Raspberry Pi),
	// x86_pkg_temp, acpitz. Falls back to Zone when the driver gives none.
	Type    string
	Celsius float64
}

// Temperatures reads every root/sys/class/thermal/thermal_zone*/temp (millidegrees Celsius), in
// zone order. A machine without thermal zones (many VMs) has none, which is not an error; a zone
// whose sensor cannot be read right now (some return EINVAL or ENODATA while powered down) is
// left out.
func Temperatures(root string) []Temperature {
	dirs, _ := filepath.Glob(filepath.Join(root, "sys/class/thermal/thermal_zone*"))
	var out []Temperature
	for _, d := range dirs {
		zone := filepath.Base(d)
		raw, ok := readValue(d, "temp")
		if !ok {
			continue
		}
		milli, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			continue
		}
		typ, ok := readValue(d, "type")
		if !ok {
			typ = zone
		}
		out = append(out, Temperature{Zone: zone, Type: typ, Celsius: float64(milli) / 1000})
	}
	sort.Slice(out, func(i, j int) bool { return zoneNumber(out[i].Zone) < zoneNumber(out[j].Zone) })
	return out
}

func zoneNumber(zone string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(zone, "thermal_zone"))
	return n
}

// Throttling is the Raspberry Pi firmware's view of power and heat (vcgencmd get_throttled), each
// flag as "now" and as "since boot".
type Throttling struct {
	UnderVoltage, FreqCapped, Throttled, SoftTempLimit                            bool
	UnderVoltageOccurred, FreqCappedOccurred, ThrottledOccurred, SoftTempOccurred bool
	// Source says where the flags came from: "get_throttled" (every flag), "rpi_volt" (the hwmon
	// under-voltage alarm only, on kernels without get_throttled).
	Source string
}

// The bits of the firmware's get_throttled word.
const (
	throttleUnderVoltage     = 1 << 0
	throttleFreqCapped       = 1 << 1
	throttleThrottled        = 1 << 2
	throttleSoftTemp         = 1 << 3
	throttleUnderVoltageEver = 1 << 16
	throttleFreqCappedEver   = 1 << 17
	throttleThrottledEver    = 1 << 18
	throttleSoftTempEver     = 1 << 19
)

// DecodeThrottled decodes the firmware's get_throttled bitmask (e.g. 0x50005: under-voltage and
// throttled now, and both since boot).
func DecodeThrottled(v uint64) Throttling {
	return Throttling{
		UnderVoltage:         v&throttleUnderVoltage != 0,
		FreqCapped:           v&throttleFreqCapped != 0,
		Throttled:            v&throttleThrottled != 0,
		SoftTempLimit:        v&throttleSoftTemp != 0,
		UnderVoltageOccurred: v&throttleUnderVoltageEver != 0,
		FreqCappedOccurred:   v&throttleFreqCappedEver != 0,
		ThrottledOccurred:    v&throttleThrottledEver != 0,
		SoftTempOccurred:     v&throttleSoftTempEver != 0,
		Source:               "get_throttled",
	}
}

// Active lists the flags that hold now, by name, in bit order: under-voltage, freq-capped,
// throttled, soft-temp-limit.
func (t Throttling) Active() []string {
	return names(t.UnderVoltage, t.FreqCapped, t.Throttled, t.SoftTempLimit)
}

// Occurred lists the flags that held at some time since boot, named as Active names them.
func (t Throttling) Occurred() []string {
	return names(t.UnderVoltageOccurred, t.FreqCappedOccurred, t.ThrottledOccurred, t.SoftTempOccurred)
}

func names(uv, capped, throttled, soft bool) []string {
	var out []string
	for _, f := range []struct {
		on   bool
		name string
	}{{uv, "under-voltage"}, {capped, "freq-capped"}, {throttled, "throttled"}, {soft, "soft-temp-limit"}} {
		if f.on {
			out = append(out, f.name)
		}
	}
	return out
}

// getThrottled are where Raspberry Pi kernels put the firmware's get_throttled word: under the
// firmware node of the soc bus (Pi 0-4), whose name differs on the Pi 5's bus layout.
var getThrottled = []string{
	"sys/devices/platform/soc/soc:firmware/get_throttled",
	"sys/devices/platform/soc*/*:firmware/get_throttled",
	"sys/devices/platform/*firmware/get_throttled",
}

// Throttled reads the Raspberry Pi throttling flags under root: the firmware's get_throttled word
// (hex, as the kernel prints it) where exposed, else the under-voltage alarm of the rpi_volt hwmon
// device (in0_lcrit_alarm). ok is false on machines with neither (anything but a Raspberry Pi).
// A malformed get_throttled is an error naming the file.
func Throttled(root string) (t Throttling, ok bool, err error) {
	for _, pattern := range getThrottled {
		matches, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, path := range matches {
			b, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			raw := strings.TrimSpace(string(b))
			v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(raw), "0x"), 16, 32)
			if err != nil {
				return Throttling{}, false, fmt.Errorf("read %s: %q is not a hex number", path, raw)
			}
			t = DecodeThrottled(v)
			if alarm, found := rpiVoltAlarm(root); found && alarm {
				t.UnderVoltage = true // the hwmon driver polls more often than a reader might
			}
			return t, true, nil
		}
	}
	if alarm, found := rpiVoltAlarm(root); found {
		return Throttling{UnderVoltage: alarm, Source: "rpi_volt"}, true, nil
	}
	return Throttling{}, false, nil
}

// rpiVoltAlarm finds the hwmon device named rpi_volt and reads its under-voltage alarm.
func rpiVoltAlarm(root string) (alarm, found bool) {
	dirs, _ := filepath.Glob(filepath.Join(root, "sys/class/hwmon/hwmon*"))
	for _, d := range dirs {
		if name, _ := readValue(d, "name"); name != "rpi_volt" {
			continue
		}
		v, ok := readValue(d, "in0_lcrit_alarm")
		if !ok {
			continue
		}
		return v != "0", true
	}
	return false, false
}
