package prom

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
)

// userHZ is the unit of the times in /proc/PID/stat. The kernel reports them in USER_HZ, which is
// 100 on every Linux architecture mqlet is built for (sysconf(_SC_CLK_TCK) would need cgo).
const userHZ = 100

// RegisterProcess registers the process_* and go_* figures client libraries export under these
// names, so existing dashboards work: CPU seconds, resident and virtual memory, start time and
// open file descriptors of this process, read from procDir ("/proc", or a fixture tree) at every
// scrape, and the Go runtime's goroutines and heap. A file that cannot be read leaves its figure
// out of the scrape (a kernel without it, another OS) instead of failing it.
func RegisterProcess(r *Registry, procDir string) {
	pageSize := float64(os.Getpagesize())
	self := filepath.Join(procDir, "self")
	r.Func("process_cpu_seconds_total", "User and system CPU time this process has used, in seconds.", CounterType, nil,
		func(emit Emit) {
			if st, err := readProcStat(filepath.Join(self, "stat")); err == nil {
				emit(float64(st.utime+st.stime) / userHZ)
			}
		})
	r.Func("process_resident_memory_bytes", "Resident memory of this process, in bytes.", GaugeType, nil,
		func(emit Emit) {
			if _, rss, err := readStatm(filepath.Join(self, "statm")); err == nil {
				emit(float64(rss) * pageSize)
			}
		})
	r.Func("process_virtual_memory_bytes", "Virtual memory of this process, in bytes.", GaugeType, nil,
		func(emit Emit) {
			if size, _, err := readStatm(filepath.Join(self, "statm")); err == nil {
				emit(float64(size) * pageSize)
			}
		})
	// The start time never changes: it is read (two files) until a scrape finds it, then kept.
	var startMu sync.Mutex
	var start float64
	r.Func("process_start_time_seconds", "Start time of this process, in seconds since the Unix epoch.", GaugeType, nil,
		func(emit Emit) {
			startMu.Lock()
			defer startMu.Unlock()
			if start == 0 {
				st, err := readProcStat(filepath.Join(self, "stat"))
				if err != nil {
					return
				}
				boot, err := readBootTime(filepath.Join(procDir, "stat"))
				if err != nil {
					return
				}
				start = float64(boot) + float64(st.starttime)/userHZ
			}
			emit(start)
		})
	r.Func("process_open_fds", "Open file descriptors of this process.", GaugeType, nil,
		func(emit Emit) {
			if fds, err := os.ReadDir(filepath.Join(self, "fd")); err == nil {
				emit(float64(len(fds)))
			}
		})
	r.Func("go_goroutines", "Goroutines that currently exist.", GaugeType, nil,
		func(emit Emit) { emit(float64(goruntime.NumGoroutine())) })
	// runtime/metrics reads the heap without stopping the world, unlike runtime.ReadMemStats.
	r.Func("go_memstats_heap_alloc_bytes", "Bytes of allocated heap objects (live and not yet collected).", GaugeType, nil,
		func(emit Emit) {
			s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
			rtmetrics.Read(s)
			if s[0].Value.Kind() == rtmetrics.KindUint64 {
				emit(float64(s[0].Value.Uint64()))
			}
		})
	r.Func("go_info", "The Go version this binary was built with.", GaugeType, []string{"version"},
		func(emit Emit) { emit(1, goruntime.Version()) })
}

// procStat is what the metrics need from /proc/PID/stat, in clock ticks.
type procStat struct {
	utime, stime, starttime uint64
}

// readProcStat parses /proc/PID/stat. The command name (field 2) is in parentheses and may hold
// spaces or parentheses itself, so fields are counted from the last ')'.
func readProcStat(path string) (procStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("%s: no command name in %q", path, b)
	}
	// After the name: state is field 3; utime is 14, stime 15, starttime 22.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("%s: %d fields after the command name, want at least 20", path, len(f))
	}
	var st procStat
	for _, x := range []struct {
		dst   *uint64
		field int
	}{{&st.utime, 14}, {&st.stime, 15}, {&st.starttime, 22}} {
		v, err := strconv.ParseUint(f[x.field-3], 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("%s: field %d: %w", path, x.field, err)
		}
		*x.dst = v
	}
	return st, nil
}

// readStatm returns the total and resident sizes in pages from /proc/PID/statm.
func readStatm(path string) (size, resident uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("%s: %d fields, want at least 2", path, len(f))
	}
	if size, err = strconv.ParseUint(f[0], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("%s: size: %w", path, err)
	}
	if resident, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("%s: resident: %w", path, err)
	}
	return size, resident, nil
}

// readBootTime returns the btime line of /proc/stat: the boot time in seconds since the epoch.
func readBootTime(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			t, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: btime: %w", path, err)
			}
			return t, nil
		}
	}
	return 0, fmt.Errorf("%s: no btime line", path)
}
