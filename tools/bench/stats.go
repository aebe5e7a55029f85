package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile is the nearest-rank percentile (p in (0,100]) of samples: always one of the samples,
// never an interpolation between two.
func percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		panic("percentile of no samples")
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[max(rank, 1)-1]
}

func ms(d time.Duration) float64 { return round1(float64(d) / float64(time.Millisecond)) }

func round1(f float64) float64 { return math.Round(f*10) / 10 }

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// memory is the resident set of a process as the kernel reports it.
type memory struct {
	RSSKiB  int64 // VmRSS
	AnonKiB int64 // RssAnon
}

func (m memory) rssMiB() float64  { return round1(float64(m.RSSKiB) / 1024) }
func (m memory) anonMiB() float64 { return round1(float64(m.AnonKiB) / 1024) }

// parseStatus reads VmRSS and RssAnon from the text of /proc/PID/status.
func parseStatus(r io.Reader) (memory, error) {
	var m memory
	var haveRSS, haveAnon bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch key {
		case "VmRSS":
			dst, haveRSS = &m.RSSKiB, true
		case "RssAnon":
			dst, haveAnon = &m.AnonKiB, true
		default:
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return memory{}, fmt.Errorf("%s: unexpected value %q", key, val)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("%s: %w", key, err)
		}
		*dst = n
	}
	if err := sc.Err(); err != nil {
		return memory{}, err
	}
	if !haveRSS || !haveAnon {
		return memory{}, fmt.Errorf("VmRSS or RssAnon missing (kernel older than 4.5?)")
	}
	return m, nil
}

func readMemory(pid int) (memory, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	f, err := os.Open(path)
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	m, err := parseStatus(f)
	if err != nil {
		return memory{}, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// clockTick is USER_HZ, the unit of /proc/PID/stat times; 100 on every Linux architecture Go runs on.
const clockTick = 10 * time.Millisecond

// cpuTime returns the user+system CPU a process has used, with its waited-for children (the runc
// processes of a shim) when children is set.
func cpuTime(pid int, children bool) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b), children)
}

func parseStatCPU(stat string, children bool) (time.Duration, error) {
	// Fields after the command name (which is in parentheses and may hold spaces): state is the
	// first, utime the 12th, stime, cutime, cstime follow.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	n := 2
	if children {
		n = 4
	}
	var ticks int64
	for _, v := range f[11 : 11+n] {
		t, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %q: %w", v, err)
		}
		ticks += t
	}
	return time.Duration(ticks) * clockTick, nil
}
