package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// counterChain is the iptables chain (filter table) that counts the MQTT links' bytes. A loopback
// packet crosses OUTPUT once and INPUT once; only OUTPUT (-o lo) jumps here, so each packet is
// counted once: --dport PORT is client -> broker, --sport PORT is broker -> client.
const counterChain = "MQLET-BENCH"

// linkCount is what the chain counted for one broker port. Bytes are whole IP packets (IP and TCP
// headers included), as iptables counts them.
type linkCount struct {
	Up, Down       uint64 // bytes client -> broker, broker -> client
	UpPkts, DnPkts uint64
	UpData         uint64 // client -> broker packets that carry payload (MQTT data, not bare ACKs or TCP keepalive probes)
	Pings          uint64 // client -> broker packets of exactly a 2-byte payload: MQTT PINGREQ
}

func (c linkCount) total() uint64 { return c.Up + c.Down }

func (c linkCount) sub(o linkCount) linkCount {
	return linkCount{c.Up - o.Up, c.Down - o.Down, c.UpPkts - o.UpPkts, c.DnPkts - o.DnPkts, c.UpData - o.UpData, c.Pings - o.Pings}
}

// counters owns the chain's rules for a set of broker ports.
type counters struct {
	iptables string
	ports    []int
	ackLen   int // a TCP segment without payload on loopback: IP 20 + TCP 20 (+12 with timestamps)
}

func iptablesCmd(bin string, args ...string) error {
	out, err := exec.Command(bin, append([]string{"-w", "-t", "filter"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newCounters creates the chain with rules for ports and hooks it into OUTPUT. Whatever an earlier
// run left is removed first.
func newCounters(bin string, ports []int) (*counters, error) {
	if err := removeCounters(bin); err != nil {
		return nil, err
	}
	c := &counters{iptables: bin, ports: ports, ackLen: 52}
	if ts, err := os.ReadFile("/proc/sys/net/ipv4/tcp_timestamps"); err == nil && strings.TrimSpace(string(ts)) == "0" {
		c.ackLen = 40
	}
	rules := [][]string{{"-N", counterChain}}
	for _, p := range ports {
		ps := strconv.Itoa(p)
		rules = append(rules,
			[]string{"-A", counterChain, "-p", "tcp", "--dport", ps},
			[]string{"-A", counterChain, "-p", "tcp", "--sport", ps},
			[]string{"-A", counterChain, "-p", "tcp", "--dport", ps, "-m", "length", "--length", fmt.Sprintf("%d:65535", c.ackLen+1)},
			[]string{"-A", counterChain, "-p", "tcp", "--dport", ps, "-m", "length", "--length", strconv.Itoa(c.ackLen + 2)},
		)
	}
	rules = append(rules, []string{"-I", "OUTPUT", "1", "-o", "lo", "-j", counterChain})
	for _, r := range rules {
		if err := iptablesCmd(bin, r...); err != nil {
			return nil, errors.Join(err, removeCounters(bin))
		}
	}
	return c, nil
}

// removeCounters unhooks and deletes the chain; a chain that is not there is no error.
func removeCounters(bin string) error {
	if bin == "" {
		return nil
	}
	if err := exec.Command(bin, "-w", "-t", "filter", "-n", "-L", counterChain).Run(); err != nil {
		return nil // no such chain
	}
	for i := 0; i < 20; i++ {
		if iptablesCmd(bin, "-D", "OUTPUT", "-o", "lo", "-j", counterChain) != nil {
			break
		}
	}
	return errors.Join(iptablesCmd(bin, "-F", counterChain), iptablesCmd(bin, "-X", counterChain))
}

func (c *counters) remove() error { return removeCounters(c.iptables) }

// read returns the counts per port.
func (c *counters) read() (map[int]linkCount, error) {
	out, err := exec.Command(c.iptables, "-w", "-t", "filter", "-n", "-v", "-x", "-L", counterChain).Output()
	if err != nil {
		return nil, fmt.Errorf("iptables -L %s: %w", counterChain, err)
	}
	return parseCounters(string(out), c.ports, c.ackLen)
}

// parseCounters reads `iptables -nvxL CHAIN`: a title line, a header line, then one line per rule,
// "pkts bytes target prot opt in out source destination tcp dpt:PORT [length N[:M]]".
func parseCounters(listing string, ports []int, ackLen int) (map[int]linkCount, error) {
	res := map[int]linkCount{}
	lines := strings.Split(strings.TrimSpace(listing), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("iptables listing of %s too short: %q", counterChain, listing)
	}
	seen := 0
	for _, line := range lines[2:] {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		pkts, err1 := strconv.ParseUint(f[0], 10, 64)
		bytes, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("iptables listing line %q: not pkts and bytes", line)
		}
		for _, p := range ports {
			c := res[p]
			dpt, spt := slicesContains(f, fmt.Sprintf("dpt:%d", p)), slicesContains(f, fmt.Sprintf("spt:%d", p))
			i := indexOf(f, "length")
			switch {
			case dpt && i < 0:
				c.Up, c.UpPkts = bytes, pkts
			case spt && i < 0:
				c.Down, c.DnPkts = bytes, pkts
			case dpt && i+1 < len(f) && f[i+1] == strconv.Itoa(ackLen+2):
				c.Pings = pkts
			case dpt && i+1 < len(f):
				c.UpData = pkts
			default:
				continue
			}
			res[p] = c
			seen++
		}
	}
	if seen != 4*len(ports) {
		return nil, fmt.Errorf("iptables chain %s: found %d of the %d counting rules:\n%s", counterChain, seen, 4*len(ports), listing)
	}
	return res, nil
}

func slicesContains(f []string, s string) bool { return indexOf(f, s) >= 0 }

func indexOf(f []string, s string) int {
	for i, x := range f {
		if x == s {
			return i
		}
	}
	return -1
}

// counterSample is one reading of every port's counts.
type counterSample struct {
	t time.Time
	c map[int]linkCount
}

// poller reads the counters at a fixed period into a series, for the idle figure.
type poller struct {
	mu      sync.Mutex
	samples []counterSample
	err     error
	stop    chan struct{}
	done    chan struct{}
}

func (c *counters) poll(period time.Duration) *poller {
	p := &poller{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			m, err := c.read()
			now := time.Now()
			p.mu.Lock()
			if err != nil {
				p.err = err
				p.mu.Unlock()
				return
			}
			p.samples = append(p.samples, counterSample{now, m})
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *poller) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *poller) snapshot() ([]counterSample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.samples, p.err
}

// idleWindow is one client's idle measurement: from just after it sent MQTT data (its last
// publish, or a keepalive PINGREQ) to just after a later PINGREQ, at least minWindow apart. Both
// edges sit at the same point of the keepalive cycle, so the window holds whole cycles (keepalive
// exchange plus any TCP keepalive probes in between) and scaling it to an hour carries no error
// from where the cycle happened to be when the window opened. A client that never pings (one
// that sends data all the time) gets a window ending at minWindow + keepalive + 15 s.
type idleWindow struct {
	port       int
	start, end int // sample indexes; -1 until found
	noPing     bool
	noStart    bool
}

// advance looks for the window's edges in the samples so far; it reports whether both are known.
func (w *idleWindow) advance(s []counterSample, settle time.Time, minWindow, keepalive time.Duration) bool {
	sent := func(i int) bool { return i > 0 && s[i].c[w.port].UpData > s[i-1].c[w.port].UpData }
	grace := keepalive + 15*time.Second
	if w.start < 0 {
		if len(s) == 0 || s[len(s)-1].t.Before(settle) {
			return false
		}
		for i := len(s) - 1; i > 0; i-- {
			if !s[i].t.After(settle) && sent(i) {
				w.start = i
				break
			}
		}
		if w.start < 0 {
			for i := 1; i < len(s); i++ {
				if s[i].t.After(settle) && sent(i) {
					w.start = i
					break
				}
			}
		}
		if w.start < 0 {
			i := firstAt(s, settle.Add(grace))
			if i < 0 {
				return false
			}
			w.start, w.noStart = i, true
		}
	}
	if w.end < 0 {
		from := s[w.start].t.Add(minWindow)
		for i := w.start + 1; i < len(s); i++ {
			if !s[i].t.Before(from) && sent(i) {
				w.end = i
				return true
			}
		}
		if i := firstAt(s, from.Add(grace)); i >= 0 {
			w.end, w.noPing = i, true
			return true
		}
		return false
	}
	return true
}

// firstAt is the index of the first sample taken at or after t, -1 if none yet.
func firstAt(s []counterSample, t time.Time) int {
	for i := range s {
		if !s[i].t.Before(t) {
			return i
		}
	}
	return -1
}

// idleResult is a finished window.
type idleResult struct {
	Seconds float64
	Count   linkCount
	KBPerH  float64
	NoPing  bool
	NoStart bool
}

func (w *idleWindow) result(s []counterSample) idleResult {
	d := s[w.end].t.Sub(s[w.start].t)
	c := s[w.end].c[w.port].sub(s[w.start].c[w.port])
	return idleResult{
		Seconds: round1(d.Seconds()),
		Count:   c,
		KBPerH:  round2(float64(c.total()) / d.Seconds() * 3600 / 1000),
		NoPing:  w.noPing,
		NoStart: w.noStart,
	}
}
