package hw

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CPUInfo is what /proc/cpuinfo says about the processors and, on ARM boards, the board.
type CPUInfo struct {
	// Count is the number of processors listed (the online ones).
	Count int
	// Model names the processor: x86's and 32-bit ARM's "model name", else the ARM core that
	// "CPU implementer"/"CPU part" identify (arm64 kernels print no model name), e.g.
	// "ARM Cortex-A72".
	Model string
	// Hardware, Revision, Serial and BoardModel are the trailing lines ARM kernels print:
	// "Hardware" (the SoC family, e.g. BCM2835, which Raspberry Pi kernels print for every
	// model), the board's "Revision" code, its "Serial" and "Model"
	// ("Raspberry Pi 4 Model B Rev 1.4"). Empty where the kernel prints none (x86).
	Hardware, Revision, Serial, BoardModel string
}

// armParts names the ARM Ltd (implementer 0x41) cores found on edge boards, by "CPU part".
var armParts = map[string]string{
	"0xb76": "ARM1176",
	"0xc07": "Cortex-A7",
	"0xc08": "Cortex-A8",
	"0xc09": "Cortex-A9",
	"0xc0f": "Cortex-A15",
	"0xd03": "Cortex-A53",
	"0xd04": "Cortex-A35",
	"0xd05": "Cortex-A55",
	"0xd07": "Cortex-A57",
	"0xd08": "Cortex-A72",
	"0xd09": "Cortex-A73",
	"0xd0a": "Cortex-A75",
	"0xd0b": "Cortex-A76",
	"0xd0d": "Cortex-A77",
	"0xd41": "Cortex-A78",
	"0xd46": "Cortex-A510",
	"0xd47": "Cortex-A710",
	"0xd4d": "Cortex-A715",
}

// CPU reads root/proc/cpuinfo. A missing file is an error (every Linux has it); a file without
// some of the fields leaves those empty.
func CPU(root string) (CPUInfo, error) {
	path := filepath.Join(root, "proc/cpuinfo")
	f, err := os.Open(path)
	if err != nil {
		return CPUInfo{}, fmt.Errorf("read cpu info: %w", err)
	}
	defer f.Close()
	var info CPUInfo
	var implementer, part string
	s := bufio.NewScanner(f)
	for s.Scan() {
		key, val, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "processor":
			info.Count++
		case "model name":
			if info.Model == "" {
				info.Model = val
			}
		case "CPU implementer":
			if implementer == "" {
				implementer = val
			}
		case "CPU part":
			if part == "" {
				part = val
			}
		case "Hardware":
			info.Hardware = val
		case "Revision":
			info.Revision = val
		case "Serial":
			info.Serial = val
		case "Model":
			info.BoardModel = val
		}
	}
	if err := s.Err(); err != nil {
		return CPUInfo{}, fmt.Errorf("read cpu info %s: %w", path, err)
	}
	if info.Model == "" && implementer == "0x41" {
		if name, ok := armParts[strings.ToLower(part)]; ok {
			info.Model = "ARM " + name
		}
	}
	return info, nil
}
