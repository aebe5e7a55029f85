package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 20; i >= 1; i-- { // unsorted on purpose
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 10 * time.Millisecond}, {90, 18 * time.Millisecond}, {100, 20 * time.Millisecond}, {1, time.Millisecond}} {
		if got := percentile(s, c.p); got != c.want {
			t.Errorf("p%v of 1..20ms = %v, want %v", c.p, got, c.want)
		}
	}
	if s[0] != 20*time.Millisecond {
		t.Errorf("percentile reordered its input")
	}
}

func TestParseStatus(t *testing.T) {
	const status = "Name:\tmqlet\nVmPeak:\t  900000 kB\nVmRSS:\t   14336 kB\nRssAnon:\t    5120 kB\nRssFile:\t    9216 kB\n"
	m, err := parseStatus(strings.NewReader(status))
	if err != nil {
		t.Fatal(err)
	}
	if m.RSSKiB != 14336 || m.AnonKiB != 5120 {
		t.Fatalf("got %+v, want VmRSS 14336 and RssAnon 5120", m)
	}
	if m.rssMiB() != 14 || m.anonMiB() != 5 {
		t.Fatalf("MiB: got %v and %v, want 14 and 5", m.rssMiB(), m.anonMiB())
	}
}

func TestParseStatusMissingField(t *testing.T) {
	if _, err := parseStatus(strings.NewReader("Name:\tx\nVmRSS:\t 10 kB\n")); err == nil {
		t.Fatal("no error for a status without RssAnon")
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name holds a space and a parenthesis, as a process can make it.
	const stat = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 20 10 20 0 9 0 100 1000 200"
	got, err := parseStatCPU(stat, false)
	if err != nil {
		t.Fatal(err)
	}
	if got != 100*time.Millisecond {
		t.Errorf("utime+stime = %v, want 100ms", got)
	}
	got, err = parseStatCPU(stat, true)
	if err != nil {
		t.Fatal(err)
	}
	if got != 400*time.Millisecond {
		t.Errorf("with children = %v, want 400ms", got)
	}
}

// results.json carries containerd's own burst, and the burst target is 0.8 x that floor.
func TestBurstFloorRecordedAndTarget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	if err := writeResults(path, results{Burst20Ms: 790, CtrBurst20Ms: 1000}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("results.json: %v\n%s", err, data)
	}
	if v, ok := got["ctr_burst20_ms"].(float64); !ok || v != 1000 {
		t.Errorf("results.json ctr_burst20_ms = %v (present %v), want 1000:\n%s", got["ctr_burst20_ms"], ok, data)
	}

	for _, c := range []struct {
		burst, floor float64
		met          bool
	}{{790, 1000, true}, {800, 1000, true}, {810, 1000, false}, {500, 0, false}} {
		r := results{Burst20Ms: c.burst, CtrBurst20Ms: c.floor, ran: []string{"burst"}}
		if r.burstMet() != c.met {
			t.Errorf("burst %v ms against a ctr floor of %v ms: met = %v, want %v", c.burst, c.floor, r.burstMet(), c.met)
		}
		var out strings.Builder
		printResults(&out, r)
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, "burst20_ms") {
				line = l
			}
		}
		if want := fmt.Sprintf("<= 0.8 x ctr burst (%.1f)", 0.8*c.floor); !strings.Contains(line, want) {
			t.Errorf("burst row %q does not show the target %q", line, want)
		}
		if strings.Contains(line, "MISSED") == c.met {
			t.Errorf("burst row %q: want met=%v", line, c.met)
		}
	}
}
