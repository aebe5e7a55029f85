package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A listing as iptables 1.8.9 (nf_tables) prints it for two ports.
const listing = `Chain MQLET-BENCH (1 references)
    pkts      bytes target     prot opt in     out     source               destination         
      12      630            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp dpt:18831
      11      578            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp spt:18831
       3      162            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp dpt:18831 length 53:65535
       2      108            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp dpt:18831 length 54
       4      208            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp dpt:18832
       4      208            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp spt:18832
       0        0            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp dpt:18832 length 53:65535
       0        0            6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp dpt:18832 length 54
`

func TestParseCounters(t *testing.T) {
	got, err := parseCounters(listing, []int{18831, 18832}, 52)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]linkCount{
		18831: {Up: 630, Down: 578, UpPkts: 12, DnPkts: 11, UpData: 3, Pings: 2},
		18832: {Up: 208, Down: 208, UpPkts: 4, DnPkts: 4},
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("port %d: got %+v, want %+v", p, got[p], w)
		}
	}
	if _, err := parseCounters(listing, []int{18831, 18833}, 52); err == nil {
		t.Error("a port without rules was not reported")
	}
}

// series makes one sample per second for port 1 from a list of (second, data sent?, bytes added).
func series(n int, sends map[int]uint64) []counterSample {
	t0 := time.Unix(1000, 0)
	var s []counterSample
	var c linkCount
	for i := 0; i <= n; i++ {
		if b, ok := sends[i]; ok {
			c.Up += b
			c.Down += b
			c.UpData++
		} else if i%15 == 0 {
			c.Up += 52 // a TCP keepalive probe: no data
			c.Down += 52
		}
		s = append(s, counterSample{t0.Add(time.Duration(i) * time.Second), map[int]linkCount{1: c}})
	}
	return s
}

// The window opens at the last data before the settle point and closes at the first ping at
// least the minimum window later: whole keepalive cycles.
func TestIdleWindowWholeCycles(t *testing.T) {
	// Status publishes at 3 and 4 s, then a ping every 65 s from the last send.
	sends := map[int]uint64{3: 1000, 4: 1000, 69: 54, 134: 54, 199: 54, 264: 54, 329: 54, 394: 54}
	s := series(400, sends)
	w := &idleWindow{port: 1, start: -1, end: -1}
	if !w.advance(s, s[10].t, 300*time.Second, 60*time.Second) {
		t.Fatal("window not complete")
	}
	if w.start != 4 || w.end != 329 || w.noPing || w.noStart {
		t.Fatalf("window %+v, want start 4, end 329", w)
	}
	res := w.result(s)
	if res.Seconds != 325 || res.Count.UpData != 5 {
		t.Errorf("result %+v, want 325 s and 5 data packets", res)
	}
	// Not complete while the end is not in sight.
	w = &idleWindow{port: 1, start: -1, end: -1}
	if w.advance(s[:300], s[10].t, 300*time.Second, 60*time.Second) {
		t.Errorf("complete too early: %+v", w)
	}
}

// A client that sends nothing gets a window anyway, flagged.
func TestIdleWindowNoData(t *testing.T) {
	s := series(500, nil)
	w := &idleWindow{port: 1, start: -1, end: -1}
	if !w.advance(s, s[5].t, 300*time.Second, 60*time.Second) {
		t.Fatal("window not complete")
	}
	if !w.noStart || !w.noPing {
		t.Errorf("window %+v: want both edges flagged", w)
	}
}

func TestCountPublishes(t *testing.T) {
	log := filepath.Join(t.TempDir(), "mosquitto.log")
	data := `1795382239: Received PUBLISH from bench (d0, q1, r1, m1, 'mqlet/v2/nodes/bench/online', ... (160 bytes))
1795382239: Received PUBLISH from bench (d0, q1, r1, m2, 'mqlet/v2/nodes/bench/status/pods/default/pods-00', ... (1500 bytes))
1795382239: Received PUBLISH from bench-reader-1234 (d0, q1, r1, m2, 'mqlet/v2/nodes/bench/status/pods/default/pods-00', ... (1500 bytes))
1795382239: Received PUBLISH from bench (d0, q1, r1, m3, 'mqlet/v2/nodes/bench/status/pods/default/pods-01', ... (1501 bytes))
1795382239: Sending PUBLISH to bench (d0, q1, r1, m1, 'mqlet/v2/nodes/bench/index', ... (90 bytes))
1795382239: Received PINGREQ from bench
`
	if err := os.WriteFile(log, []byte("earlier line\n"+data), 0o644); err != nil {
		t.Fatal(err)
	}
	pc, err := countPublishes(log, int64(len("earlier line\n")))
	if err != nil {
		t.Fatal(err)
	}
	if pc.received["status/pods"] != 2 || pc.received["online"] != 1 || pc.sent["index"] != 1 || len(pc.received) != 2 {
		t.Errorf("counts %+v", pc)
	}
	if pc.receivedBytes != 3161 || pc.sentBytes != 90 {
		t.Errorf("bytes %d %d", pc.receivedBytes, pc.sentBytes)
	}
}
