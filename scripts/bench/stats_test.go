package main

import (
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
