package hw

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MemTotal is the total memory in bytes that root/proc/meminfo reports (MemTotal), which is what
// kubelet reports as memory capacity.
func MemTotal(root string) (int64, error) {
	return memTotal(filepath.Join(root, "proc/meminfo"))
}

func memTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: MemTotal %q: %w", path, fields[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s: no MemTotal line", path)
}

// ProcessHasCapability reports whether process pid holds capability bit cap in its effective set.
func ProcessHasCapability(pid int, cap uint) bool {
	return capEff(fmt.Sprintf("/proc/%d/status", pid), cap)
}

func capEff(statusFile string, cap uint) bool {
	b, err := os.ReadFile(statusFile)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<cap) != 0
		}
	}
	return false
}

// SwapDevices lists the swap areas in use (the first field of each line of root/proc/swaps after
// its header): none means swap is off.
func SwapDevices(root string) ([]string, error) {
	path := filepath.Join(root, "proc/swaps")
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var devices []string
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		if fields := strings.Fields(sc.Text()); !first && len(fields) > 0 {
			devices = append(devices, fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return devices, nil
}
